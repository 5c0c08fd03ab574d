"""The compressor base's engine helpers (gvq/compressors/base.py): receive buffers on the caller's device."""
from __future__ import annotations

import pytest
import torch

from gvq.compressors.base import Compressor
from gvq.compressors.fp16 import FP16
from gvq.compressors.qsgd import QSGD


@pytest.mark.parametrize("comp", [Compressor(), FP16(), QSGD(bits=4)], ids=lambda c: c.name)
def test_receive_buffers_live_on_the_device_asked_for(comp):
    """``meta`` has no data: a buffer made on the host instead would show as device cpu here."""
    seg = slice(0, 3000)
    buf = comp.empty_payload(seg, torch.device("meta"))
    assert buf.device.type == "meta"
    assert buf.numel() * buf.element_size() == comp.payload_nbytes(seg)
