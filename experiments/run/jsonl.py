"""JSON-lines files of a run (``metrics.jsonl``, ``timing.jsonl``, ``sft.jsonl``, ...):
whole-line appends, atomic rewrites and readers that survive a killed writer.

A process killed while appending can leave a last line without its newline (or a disk
that fills up can cut one). The writer here never leaves one behind on its own: each
record is one ``os.write`` of the whole line on an ``O_APPEND`` descriptor, and a write
that fails or comes back short is undone (the file is truncated to its previous size).
Readers still accept a file a killed process left: an unparseable *last* line without a
newline is dropped with a `PartialLineWarning`; an unparseable line anywhere else is
damage, and raises `ValueError` naming the file and the line number.
"""

from __future__ import annotations

import json
import os
import pathlib
import warnings
from typing import Any, Callable, Iterable

__all__ = ["PartialLineWarning", "append_line", "read_records", "rewrite_lines"]


class PartialLineWarning(UserWarning):
    """A JSONL file ended in a partial line (a writer was killed mid-line); it was dropped."""


def append_line(path: str | os.PathLike, record: dict[str, Any],
                default: Callable[[Any], Any] | None = None) -> None:
    """Append ``record`` as one JSON line with a single write.

    Raises:
      OSError: the write failed (e.g. ``ENOSPC``, ``EACCES``); the file is left as it was
        (any bytes of the partial line are truncated away), ``filename`` is set.
    """
    data = (json.dumps(record, default=default) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        try:
            written = os.write(fd, data)
            if written != len(data):  # a short write: the disk is full
                raise OSError(28, "No space left on device (short write)")
        except OSError as err:
            try:
                os.ftruncate(fd, size)
            except OSError:
                pass
            if err.filename is None:
                err.filename = os.fspath(path)
            raise
    finally:
        os.close(fd)


def rewrite_lines(path: str | os.PathLike, lines: Iterable[str]) -> None:
    """Replace the file's content with ``lines`` (each without its newline) atomically:
    a temporary file in the same directory, then `os.replace`. On failure the original
    is untouched and the temporary file is removed."""
    path = pathlib.Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in lines))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        _remove(tmp)
        raise


def read_records(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Every JSON object of a JSONL file (blank lines skipped); ``[]`` if it is missing.

    A last line that does not parse and has no final newline is dropped with a
    `PartialLineWarning` naming the file.

    Raises:
      ValueError: ``<path>:<line>: invalid JSON (...)`` for a bad line that is not a
        partial last line.
    """
    path = pathlib.Path(path)
    if not path.exists():
        return []
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    records = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as e:
            if i == len(lines):  # no newline after it: the writer was cut off
                warnings.warn(f"{path}:{i}: dropped a partial last line ({len(line)} "
                              "characters; the writer was interrupted)", PartialLineWarning,
                              stacklevel=2)
                break
            raise ValueError(f"{path}:{i}: invalid JSON ({e})") from None
    return records


def _remove(path: pathlib.Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass


def leading_steps(path: str | os.PathLike, steps: int, what: str = "steps",
                  error: type[Exception] = ValueError) -> list[dict[str, Any]]:
    """The first ``steps`` records of a per-step JSONL file (``[]`` when it is missing),
    which must start with ``step`` 0 .. ``steps - 1``, each once and in order: a missing,
    partial or repeated line there is a gap.

    Raises:
      error: the file holds fewer leading steps in order (``<path> holds <what> 0 .. k - 1
        in order, the checkpoint has done <what> 0 .. steps - 1``).
    """
    records = read_records(path) if pathlib.Path(path).exists() else []
    held = next((i for i, r in enumerate(records) if r.get("step") != i), len(records))
    if held < steps:
        raise error(f"{path} holds {what} 0 .. {held - 1} in order, the checkpoint has done "
                    f"{what} 0 .. {steps - 1}")
    return records[:steps]

