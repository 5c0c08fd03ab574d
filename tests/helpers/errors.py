"""What a user sees of an exception gvq raises at them: its message and what Python prints for it uncaught."""
from __future__ import annotations

import traceback

#: what a chained report prints: Python's two joins, and Hydra's advice (``+key=`` does not add a typed key)
CHAINED = ("The above exception was the direct cause", "During handling of the above exception",
           "To append to your config use +")


def assert_one_line_unchained(e: BaseException) -> None:
    """``e``'s message is one line, and nothing is chained to it: uncaught, it prints its own short
    traceback and that line, not OmegaConf's and Hydra's reports above it."""
    assert "\n" not in str(e), str(e)
    assert e.__cause__ is None and (e.__context__ is None or e.__suppress_context__), repr(e.__cause__ or e.__context__)
    shown = "".join(traceback.format_exception(e))
    assert not [c for c in CHAINED if c in shown], shown
