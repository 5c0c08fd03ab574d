"""Probe the host's virtual-clock lock (gvq/comm/clock.py) from a test."""
from __future__ import annotations

import fcntl
import os

from gvq.comm import clock


def clock_lock_free() -> bool:
    """Can another open file description take the host's clock lock right now?"""
    fd = clock._open_lock()
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
