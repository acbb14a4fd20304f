"""Progress bars of the job's long phases (the warm start, RL): tqdm on stderr, redrawn in
place on a terminal; written to a file or a pipe (a sweep's run log, ``nohup``), a line at
most every `LOG_INTERVAL_S` seconds instead of one per update."""

from __future__ import annotations

import sys
from typing import Any, Iterable

from tqdm import tqdm

LOG_INTERVAL_S = 30.0


def progress_bar(iterable: Iterable[Any], *, desc: str, show: bool = True, initial: int = 0,
                 total: int | None = None, file: Any = None) -> tqdm:
    """A tqdm bar over ``iterable`` on ``file`` (stderr), disabled unless ``show``."""
    file = sys.stderr if file is None else file
    is_tty = getattr(file, "isatty", lambda: False)()
    return tqdm(iterable, desc=desc, initial=initial, total=total, disable=not show,
                dynamic_ncols=True, file=file, mininterval=0.1 if is_tty else LOG_INTERVAL_S)
