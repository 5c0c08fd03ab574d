"""Imported by the fork server alone, first of :data:`gvq.run.warm.PRELOAD`, before torch:

* the server dies with its launcher (``PR_SET_PDEATHSIG``), even mid-import: a launcher that stops at a
  config error, a second after it started the server, must not leave it importing torch for seconds more
  while holding the launcher's stdout and stderr (``subprocess.run(capture_output=True)`` and
  ``| tee`` wait for those to close);
* when it ends the ordinary way (its launcher closed the pipe it watches), it skips the interpreter's
  teardown of torch and its compile machinery (``gvq.comm.internals.TORCH_FIRST_STEP_MODULE``) once the
  atexit handlers registered after this one have run (last in, first out).

The ranks it forks are unaffected: a fork clears the death signal, and they end in ``os._exit``.
"""
import atexit
import os
import signal
import sys


def _exit_now() -> None:
    for f in (sys.stdout, sys.stderr):
        f.flush()
    os._exit(0)


try:
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))       # 1: PR_SET_PDEATHSIG
except (OSError, AttributeError):                                           # not Linux: the pipe only
    pass
atexit.register(_exit_now)
