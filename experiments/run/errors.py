"""Errors a user can act on, and their one-paragraph form on the command line.

`entr-run` (``experiments.run.cli.main``) prints any failure as one paragraph and exits with
status 2 for bad input or a failing environment (`RunError`, `ValueError`, `OSError`, a
checkpoint that cannot be restored, an SGLang fleet that cannot answer) and 1 for anything
else (a bug); the traceback goes
to ``<run_dir>/logs/error.log`` and, with ``--debug`` or ``ENTR_DEBUG=1``, to stderr.
"""

from __future__ import annotations

import errno
import os

__all__ = ["ConfigError", "ResumeRefused", "RunError", "describe", "disk_full", "is_complete",
           "is_user_error"]


class RunError(Exception):
    """A failure the message fully explains: what failed and where."""


class ConfigError(RunError, ValueError):
    """The configuration is invalid or contradicts the environment (devices, files)."""


class ResumeRefused(RunError):
    """``--resume`` with a configuration that would change the experiment."""


def _first_paragraph(text: str, limit: int = 2000) -> str:
    """The lines of ``text`` up to its first blank line (a message puts what failed and its
    fix there; details may follow after a blank line)."""
    lines = text.strip().splitlines()
    end = next((i for i, ln in enumerate(lines) if not ln.strip()), len(lines))
    paragraph = "\n".join(ln.rstrip() for ln in lines[:end])
    return paragraph if len(paragraph) <= limit else paragraph[:limit - 3] + "..."


def describe(err: BaseException) -> str:
    """One paragraph saying what failed, where, and the fix when the message has one.

    An `OSError` with a file name reads ``<what failed>: <path>``, e.g. ``No space left on
    device: runs/x/metrics.jsonl``; other errors give their message's first paragraph
    (the lines up to the first blank one).
    """
    if isinstance(err, OSError) and err.filename is not None:
        what = err.strerror or _first_paragraph(str(err)) or type(err).__name__
        where = os.fsdecode(err.filename)
        if err.filename2 is not None:
            where += f" -> {os.fsdecode(err.filename2)}"
        hint = {errno.EACCES: " (permission denied: is the directory read-only?)",
                errno.EROFS: " (read-only file system)",
                errno.ENOSPC: " (the disk is full)",
                errno.ENAMETOOLONG: " (a path component is longer than the file system "
                                    "allows)"}.get(err.errno, "")
        return f"{what}: {where}{hint}"
    return _first_paragraph(str(err)) or type(err).__name__


def disk_full(err: BaseException) -> OSError | None:
    """The ``ENOSPC`` `OSError` behind ``err`` (itself, or one in its chain of causes and
    contexts: a library that wraps the write's error), or None when the disk is not why
    ``err`` happened."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno == errno.ENOSPC:
            return err
        err = err.__cause__ or err.__context__
    return None


def is_complete(err: BaseException) -> bool:
    """Whether the message of ``err`` says everything (no traceback is worth showing):
    a `RunError`, a file refused with what is wrong with it, a data file found nowhere
    (its message lists the fixes), a fleet that cannot answer (its message names every
    server), or a checkpoint that cannot be restored (its message names the log)."""
    from entr_jax.data.files import DataNotFoundError
    from entr_jax.data.procedural import MissingExtraError
    from entr_jax.file_errors import BadFileError
    from learners.checkpoint import CheckpointRestoreError
    from samplers.sglang_routing import FleetError

    return isinstance(err, (RunError, BadFileError, DataNotFoundError, FleetError,
                            CheckpointRestoreError, MissingExtraError))


def is_user_error(err: BaseException) -> bool:
    """Whether ``err`` is bad input or a failing environment (exit status 2, a fleet that
    cannot answer included), as opposed to an unexpected error (exit status 1)."""
    from entr_jax.data.procedural import MissingExtraError
    from learners.checkpoint import CheckpointRestoreError
    from samplers.sglang_routing import FleetError

    return isinstance(err, (RunError, ValueError, OSError, CheckpointRestoreError, FleetError,
                            MissingExtraError))
