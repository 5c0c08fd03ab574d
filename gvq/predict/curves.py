"""Cost curves fitted to what calibration times: ``seconds = fixed + per_unit x units``, the form every
cost the model replays takes (a codec call, an add, a posted message)."""
from __future__ import annotations

import time

import numpy as np


def cpu_seconds(fn) -> float:
    """CPU seconds of this thread running ``fn()`` once (what the virtual clock counts)."""
    t0 = time.thread_time()
    fn()
    return time.thread_time() - t0


def linear(points: list[tuple[float, float]]) -> list[float]:
    """[fixed, per_value] of ``seconds = fixed + per_value * values`` (least squares, both >= 0)."""
    x = np.array([p[0] for p in points], float)
    y = np.array([p[1] for p in points], float)
    if len(set(x)) < 2:
        return [0.0, float(y.mean() / max(x.mean(), 1))]
    per, fixed = np.polyfit(x, y, 1)
    if fixed < 0:
        return [0.0, float((x * y).sum() / (x * x).sum())]
    return [float(fixed), float(max(per, 0.0))]
