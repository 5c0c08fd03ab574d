"""Where the Triton tests run: CPU tensors through Triton's interpreter (``make test``; tests/conftest.py
sets ``TRITON_INTERPRET=1`` where no CUDA is seen), or compiled on a GPU (``make gpu-check``).  A test
module calls :func:`kernel_device` at import: it skips the module where the kernels can run neither way."""
from __future__ import annotations

import os

import pytest
import torch


def kernel_device() -> str:
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "cpu"
    if not torch.cuda.is_available():
        pytest.skip("TRITON_INTERPRET is not 1 and no CUDA device: the kernels can run neither interpreted on "
                    "CPU tensors nor compiled", allow_module_level=True)
    return "cuda"


#: the interpreter runs numpy: NaN/Inf inputs and 0 / 0 (an all-zero bucket) warn there, as they should
MARKS = [pytest.mark.usefixtures("one_thread_per_module"),
         pytest.mark.filterwarnings("ignore:.*encountered:RuntimeWarning")]
