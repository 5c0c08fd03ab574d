from __future__ import annotations

import tempfile

import pytest


@pytest.fixture
def private_clock_lock(monkeypatch, tmp_path):
    """This test's own host clock lock (``gvq.comm.clock._open_lock`` opens it under the temp dir): every
    gvq process of this user shares the real one, and a virtual-time run beside the suite holds it."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path
