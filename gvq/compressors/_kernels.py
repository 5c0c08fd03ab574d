"""The one way a codec chooses and runs its kernels: each operation states its torch reference once and its
kernels beside it (``Op(torch=..., triton=..., host=...)``), and a codec's path on a device is chosen once,
by :func:`choose_path`, from the one ``compressor.kernels`` knob (``auto | triton | torch``).  Every Triton
launch starts here (:func:`launch_kernel`), so a test counts them (:func:`count_launches`).

The three paths: ``triton`` (fused Triton kernels: on CUDA, or on host tensors through the interpreter,
``TRITON_INTERPRET=1``, where asked for), ``host`` (the host's compiled kernels, numba's
:mod:`._fused`, where the codec has them), ``torch`` (the torch reference, whole-tensor ops: what CUDA runs
with ``kernels=torch``).  ``auto`` is Triton on CUDA where it is installed and the host kernels on the
host; ``torch`` is the torch ops everywhere, on the host as well.  ``GVQ_FUSED=0`` is an alias kept for
old scripts, read here only: it takes the host kernels away from every codec (``auto`` on the host then
means ``torch``).  Triton is optional (``pip install 'gvq[gpu]'``): nothing here imports it until a kernel
runs.

See docs/design.md#gvqcompressors_kernelspy for how it works and why.
"""
from __future__ import annotations

import functools
import os
from collections.abc import Callable
from contextlib import contextmanager
from typing import NamedTuple

import torch

KERNELS = ("auto", "triton", "torch")
TRITON, HOST, TORCH = "triton", "host", "torch"     # the paths :func:`choose_path` returns


@functools.lru_cache(maxsize=1)
def triton_available() -> bool:
    try:
        import triton  # noqa: F401 - imported only to learn whether it imports
    except ImportError:
        return False
    return True


def check_kernels(kernels: str) -> str:
    """``compressor.kernels``: refused in one line when ``triton`` is asked for and not installed."""
    if kernels not in KERNELS:
        raise ValueError(f"kernels={kernels!r}: must be one of {', '.join(KERNELS)}")
    if kernels == "triton" and not triton_available():
        raise ValueError("kernels=triton: Triton is not installed (pip install 'gvq[gpu]'), or choose "
                         "kernels=auto (Triton on CUDA where installed) or kernels=torch")
    return kernels


def choose_path(kernels: str, device: torch.device, *, triton: bool = True, host: bool = True,
           host_first: bool = False) -> str:
    """The path of a codec on ``device`` (:data:`TRITON`, :data:`HOST` or :data:`TORCH`), asked once per
    device (the codec keeps the answer: :func:`path_for`).  ``triton`` / ``host``: whether the codec has
    kernels of that kind at all (a layout its kernels do not fit says False); ``host_first``: on host
    tensors its host path wins over the interpreted Triton one (GradiVeQ's per-piece GEMMs: its Triton
    kernels are its device path's, which host tensors take only without the host path)."""
    device = torch.device(device)
    if kernels == "torch" or device.type != "cpu":
        on_host = False
    else:
        on_host = host and os.environ.get("GVQ_FUSED", "1") != "0"
    if on_host and host_first:
        return _host()
    if triton and kernels != "torch" and triton_available() and (
            device.type == "cuda" or (device.type == "cpu" and kernels == "triton"
                                      and os.environ.get("TRITON_INTERPRET") == "1")):
        return TRITON
    return _host() if on_host else TORCH


def _host() -> str:
    from gvq.compressors import _fused          # a host path without numba is an ImportError saying so
    _fused.require()
    return HOST


def path_for(paths: dict, kernels: str, device, **codec) -> str:
    """``paths[device]``, :func:`choose_path` on the first call there (``codec``: its keywords), never again:
    a codec's one way to ask (its ``paths`` dict is emptied when it is pickled: chosen anew per process)."""
    device = torch.device(device)
    if device not in paths:
        paths[device] = choose_path(kernels, device, **codec)
    return paths[device]


class DeviceKernels:
    """The ``kernels`` knob of a codec whose kernels are CUDA ones only (the host runs the torch ops): the
    path is chosen per device on its first call and forgotten when the codec is pickled, with the caches
    ``per_process`` names (built again in each process).  A mixin beside :class:`.base.Compressor`."""
    per_process: tuple[str, ...] = ()

    def init_kernels(self, kernels: str) -> None:
        self.kernels, self._paths = check_kernels(kernels), {}

    def __getstate__(self):
        return {**self.__dict__, "_paths": {}, **{name: {} for name in self.per_process}}

    def path(self, device) -> str:
        """Chosen on the first call on ``device`` (``compressor.kernels``)."""
        return path_for(self._paths, self.kernels, device, host=False)


class Op(NamedTuple):
    """One codec operation on every path: ``torch`` the reference, stated once; ``triton`` / ``host`` its
    kernels (None: that path runs the reference).  ``op(path, *args)`` runs the chosen one."""
    torch: Callable
    triton: Callable | None = None
    host: Callable | None = None

    def on(self, path: str) -> Callable:
        fn = self.triton if path == TRITON else self.host if path == HOST else None
        return self.torch if fn is None else fn

    def __call__(self, path: str, *args, **kw):
        return self.on(path)(*args, **kw)


# ---- launches: the one place a kernel is started, so a test can count them ------------------------
class LaunchCount:
    """Kernel launches since :func:`count_launches` began, by kernel name; ``run`` False: counted, not
    started."""

    def __init__(self, run: bool = True):
        self.launches, self.by_name, self.run = 0, {}, run


_COUNTERS: list[LaunchCount] = []


@contextmanager
def count_launches(run: bool = True):
    """``with count_launches() as c: codec.compress(x, seg)``; then ``c.launches`` (a
    ``TorchDispatchMode`` does not see Triton launches).  ``run=False`` counts without starting a kernel
    (the outputs are left unwritten): a whole model's gradient, which the interpreter would take minutes
    over, counted in no time."""
    tally = LaunchCount(run)
    _COUNTERS.append(tally)
    try:
        yield tally
    finally:
        _COUNTERS.remove(tally)


def launch_kernel(kernel, grid: tuple, *args, **meta) -> None:
    for tally in _COUNTERS:
        tally.launches += 1
        tally.by_name[kernel.__name__] = tally.by_name.get(kernel.__name__, 0) + 1
    if all(tally.run for tally in _COUNTERS):
        kernel[grid](*args, **meta)


def triton_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())
