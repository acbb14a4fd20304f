"""One way to refuse a file: `BadFileError` names the file and says what is wrong with it.

Every reader of a user's file (model ``config.json`` and weights, tokenizer files, data
files) raises `BadFileError` for a file it cannot use, so the message always starts with
the file's path: `read_json_object` for JSON files, `about_file` around a third-party
reader whose own errors name no file (``tokenizers``, ``gzip``, ``json``).
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any, Iterator

__all__ = ["BadFileError", "about_file", "read_json_object"]


class BadFileError(ValueError):
    """A file that cannot be used: ``"<path>: <what is wrong>"``, or
    ``"<path>:<line>: <what is wrong>"`` for a line of a text file.

    Attributes:
      path: the file (or directory) at fault, as given.
      problem: what is wrong with it.
      line: the 1-based line at fault, or None.
    """

    def __init__(self, path: str | os.PathLike, problem: str, line: int | None = None):
        self.path = os.fspath(path)
        self.problem = problem
        self.line = line
        where = self.path if line is None else f"{self.path}:{line}"
        super().__init__(f"{where}: {problem}")


@contextlib.contextmanager
def about_file(path: str | os.PathLike, what: str) -> Iterator[None]:
    """Turn any error raised inside the block (other than a `BadFileError`) into a
    `BadFileError` for ``path``: ``"<path>: <what> (<the error>)"``."""
    try:
        yield
    except BadFileError:
        raise
    except Exception as e:  # noqa: BLE001 - third-party readers raise plain Exceptions
        detail = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BadFileError(path, f"{what} ({detail})") from e


def read_json_object(path: str | os.PathLike) -> dict[str, Any]:
    """The JSON object held by file ``path``.

    Raises:
      FileNotFoundError: the file does not exist (named).
      BadFileError: it is not UTF-8 text, not valid JSON (with the line and column), or
        holds something other than an object.
    """
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"{os.fspath(path)} does not exist") from None
    except json.JSONDecodeError as e:
        raise BadFileError(path, f"not valid JSON (line {e.lineno}, column {e.colno}: "
                                 f"{e.msg})") from None
    except UnicodeDecodeError as e:
        raise BadFileError(path, f"not UTF-8 text ({e.reason} at byte {e.start})") from None
    if not isinstance(data, dict):
        raise BadFileError(path, f"must hold a JSON object, got {type(data).__name__}")
    return data
