"""Errors a user can act on, and their one-paragraph form on the command line.

`entr-run` (``experiments.run.main``) prints any failure as one paragraph and exits with
status 2 for bad input or a failing environment (`RunError`, `ValueError`, `OSError`, a
checkpoint that cannot be restored) and 1 for anything else (a bug); the traceback goes
to ``<run_dir>/logs/error.log`` and, with ``--debug`` or ``ENTR_DEBUG=1``, to stderr.
"""

from __future__ import annotations

import errno
import os

__all__ = ["ConfigError", "ResumeRefused", "RunError", "describe", "is_complete",
           "is_user_error"]


class RunError(Exception):
    """A failure the message fully explains: what failed and where."""


class ConfigError(RunError, ValueError):
    """The configuration is invalid or contradicts the environment (devices, files)."""


class ResumeRefused(RunError):
    """``--resume`` with a configuration that would change the experiment."""


def _first_line(text: str, limit: int = 600) -> str:
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[:limit - 3] + "..."


def describe(err: BaseException) -> str:
    """One paragraph (no newline) saying what failed and where.

    An `OSError` with a file name reads ``<what failed>: <path>``, e.g. ``No space left on
    device: runs/x/metrics.jsonl``; other errors give their message's first line.
    """
    if isinstance(err, OSError) and err.filename is not None:
        what = err.strerror or _first_line(str(err)) or type(err).__name__
        where = os.fsdecode(err.filename)
        if err.filename2 is not None:
            where += f" -> {os.fsdecode(err.filename2)}"
        hint = {errno.EACCES: " (permission denied: is the directory read-only?)",
                errno.EROFS: " (read-only file system)",
                errno.ENOSPC: " (the disk is full)",
                errno.ENAMETOOLONG: " (a path component is longer than the file system "
                                    "allows)"}.get(err.errno, "")
        return f"{what}: {where}{hint}"
    return _first_line(str(err)) or type(err).__name__


def is_complete(err: BaseException) -> bool:
    """Whether the message of ``err`` says everything (no traceback is worth showing):
    a `RunError`, or a checkpoint that cannot be restored (its message names the log)."""
    from learners.checkpoint import CheckpointRestoreError

    return isinstance(err, (RunError, CheckpointRestoreError))


def is_user_error(err: BaseException) -> bool:
    """Whether ``err`` is bad input or a failing environment (exit status 2), as opposed
    to an unexpected error (exit status 1)."""
    from learners.checkpoint import CheckpointRestoreError

    return isinstance(err, (RunError, ValueError, OSError, CheckpointRestoreError))
