"""Ranks start warm: forked from a fork server that has already imported torch and the training code.

See docs/design.md#gvqrunwarmpy for how it works and why.
"""
from __future__ import annotations

import multiprocessing
import os
import sys
import threading

from gvq.comm.internals import TORCH_FIRST_STEP_MODULE, fork_server_pid, run_exit_handlers

# what the server imports before forking ranks: first gvq.run.warm_server (the server dies with its
# launcher, and exits without tearing torch down), then everything a rank imports before its first step
PRELOAD = ["gvq.run.warm_server", "torch", "torch.distributed", TORCH_FIRST_STEP_MODULE, "gvq.run.launch",
           "gvq.run.train", "gvq.compressors._fused"]   # numba: imports a rank would pay
START_METHOD_ENV = "GVQ_START_METHOD"   # "spawn": fresh interpreters (slower start, nothing shared)


def start_method() -> str:
    """``forkserver`` where the platform has it (Linux, macOS), unless ``GVQ_START_METHOD`` names another."""
    default = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    method = os.environ.get(START_METHOD_ENV, default)
    if method not in ("forkserver", "spawn"):
        raise ValueError(f"{START_METHOD_ENV}={method!r}: must be forkserver or spawn")
    return method


def start_fork_server(preload: list[str] = PRELOAD) -> bool:
    """Start the server now (it loads ``preload`` in the background) unless this process is itself a
    rank of torchrun's, which spawns nothing.  Idempotent (a running server keeps what it loaded);
    returns whether a server is running."""
    try:
        if "LOCAL_RANK" in os.environ or start_method() != "forkserver":
            return False
    except ValueError:                  # launch() reports the bad value, as a config error
        return False
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(preload)
    from multiprocessing import forkserver
    forkserver.ensure_running()
    return True


def adopt_environment(env: dict[str, str] | None) -> None:
    """In a rank: take the launcher's environment as it was at launch (``None``: keep this one)."""
    if env is None or env == os.environ:
        return
    os.environ.clear()
    os.environ.update(env)


def server_pid() -> int | None:
    """The running fork server's pid, else None (tests find the ranks as its children)."""
    return fork_server_pid()


def exit_fast(main) -> int:
    """Run ``main`` (the CLI: it returns its exit status, None for 0, or raises ``SystemExit``), then end
    the process with that status but without the interpreter's teardown of torch's modules, which can
    take longer than a short run trains.  Everything an ordinary exit does for others still happens
    first: atexit handlers (Hydra's log file, multiprocessing's clean-up of its temp dir and children),
    stdout/stderr flushed.  Returns the status instead where the process must exit the ordinary way (it
    still runs a non-daemon thread, a launcher plugin's): the caller, ``cli.py``, exits with it.  An
    exception other than ``SystemExit`` propagates (traceback, ordinary exit)."""
    try:
        code = main()
    except SystemExit as e:
        code = e.code
    if not isinstance(code, int):
        if code is not None:
            print(code, file=sys.stderr)         # what the interpreter does with sys.exit("message")
        code = 0 if code is None else 1
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        return code
    run_exit_handlers()
    for f in (sys.stdout, sys.stderr):
        f.flush()
    os._exit(code)
