"""numba is a dependency of the host quantizers, not an optional speed-up: without it a host tensor that
needs the fused kernels is an ImportError that says what to install; ``kernels=torch`` or its alias
``GVQ_FUSED=0`` (a deliberate choice) and non-host tensors take the torch ops without it.  (The kernels'
results: test_quantizers.py.)"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# numba made unimportable, as on a machine without it, before gvq's compressors import it
_NO_NUMBA = "import sys\nsys.modules['numba'] = None\nimport torch\nfrom gvq.compressors.qsgd import QSGD\n"


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    import os
    return subprocess.run([sys.executable, "-c", _NO_NUMBA + code], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "GVQ_FUSED": "1", **env})


def test_a_host_tensor_without_numba_is_an_error_naming_it():
    code = "QSGD().compress(torch.randn(4096), slice(0, 4096))\n"
    out = _run(code)
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: gvq needs numba") and "pip install" in last and "GVQ_FUSED=0" in last


def test_without_numba_the_torch_ops_serve_when_chosen_and_off_the_host():
    code = ("from gvq.compressors import _kernels as kernels\n"
            "print(kernels.choose_path('auto', torch.device('meta')))\n")
    out = _run(code)
    assert out.returncode == 0 and out.stdout.split() == ["torch"], out.stderr[-2000:]
    out = _run("QSGD(kernels='torch').compress(torch.randn(4096), slice(0, 4096))\nprint('ok')\n")
    assert out.returncode == 0 and out.stdout.split() == ["ok"], out.stderr[-2000:]
    out = _run("QSGD().compress(torch.randn(4096), slice(0, 4096))\nprint('ok')\n", GVQ_FUSED="0")
    assert out.returncode == 0 and out.stdout.split() == ["ok"], out.stderr[-2000:]
