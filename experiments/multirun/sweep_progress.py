"""What `experiments.sweep` shows while and after it runs: one line per run as it ends
(name, status, wall time, ETA) and the label of the summary table's wall-clock column,
which measures the machine and its load, not a method."""

from __future__ import annotations

import sys

WALL_HEADER = "wall_clock_s (machine time)"
WALL_NOTE = ("wall_clock_s (machine time): each run's elapsed seconds on this machine, shared "
             "with the runs beside it and any other load; not a cost of the method (compare "
             "methods by steps, or time them alone with benchmarks/)")


def _duration(seconds: float) -> str:
    """``"42 s"``, ``"3 min 05 s"``, ``"1 h 02 min"``."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def progress_line(record: dict, done: int, total: int, elapsed_s: float, workers: int) -> str:
    """The line printed when a run ends: ``sweep: [done/total] NAME: STATUS in WALL (wall
    clock, W at a time); ETA ...``. The ETA assumes the remaining runs take as long as the
    finished ones did on average (the sweep's elapsed time per finished run)."""
    left = total - done
    eta = "all done" if left == 0 else (
        f"ETA {_duration(elapsed_s / done * left)} for the {left} left")
    return (f"sweep: [{done}/{total}] {record['name']}: {record['status']} in "
            f"{_duration(record['wall_s'])} (wall clock, {workers} at a time); {eta}")


def print_line(line: str) -> None:
    """Prints ``line`` to stderr at once (the sweep's JSON records and table go to stdout)."""
    print(line, file=sys.stderr, flush=True)
