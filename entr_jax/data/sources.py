"""Example sources: benchmark JSONL files, calculator annotations and reasoning-gym tasks.

Every source returns a list of examples, each a dict with at least

* ``id``: unique string (``"<source>/<split>/<row>"`` or the file's own id),
* ``question``: the problem text shown to the model,
* ``answer``: the ground-truth *final* answer string,
* ``source``: the source name,

plus source-specific extras (``solution`` worked solution, ``level``, ``subject``, ...).
Files are found by `entr_jax.data.files.locate`: the ``data_dir`` argument (``--data.dir``)
or ``$ENTR_DATA_DIR``, then the package (every file ships with it), the user cache, then
a checksum-checked download of the pinned upstream (``entr-data fetch`` does it ahead of
time).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import pathlib
import re
from typing import Any, Callable

from entr_jax.data.chains import chain_sum_source
from entr_jax.data.files import locate
from entr_jax.data.procedural import Example, reasoning_gym_source
from entr_jax.file_errors import BadFileError
from entr_jax.tasks.arith import ArithLimits, ArithmeticError_, format_number, safe_eval

DataDir = str | os.PathLike | None
"""A data folder (``--data.dir``); None or empty: ``$ENTR_DATA_DIR``, then the other places."""


def read_jsonl_lines(path: str | os.PathLike) -> list[tuple[int, Any]]:
    """``(line number, record)`` of every non-blank line of a JSON-lines file,
    gzip-compressed when its name ends in ``.gz``.

    Raises:
      FileNotFoundError: the file is missing (named).
      entr_jax.file_errors.BadFileError: ``<path>:<line>: invalid JSON (...)``, a line
        that is not UTF-8 text (a binary file), a ``.gz`` file that is not gzip, or
        ``<path>: holds no examples`` for a file without a single record (every source
        file is a non-empty benchmark).
    """
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {path}")
    rows = []
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            for line_no, raw in enumerate(f, 1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise BadFileError(path, f"not UTF-8 text ({e.reason} at byte {e.start} "
                                             "of the line: a binary file?); data files are "
                                             "JSON lines", line_no) from None
                if line.strip():
                    try:
                        rows.append((line_no, json.loads(line)))
                    except json.JSONDecodeError as e:
                        raise BadFileError(path, f"invalid JSON ({e})", line_no) from None
    except (gzip.BadGzipFile, EOFError) as e:
        raise BadFileError(path, f"not a complete gzip file ({e})") from None
    if not rows:
        raise BadFileError(path, "holds no examples (the file is empty)")
    return rows


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """The records of a JSON-lines file (`read_jsonl_lines`, without line numbers)."""
    return [row for _, row in read_jsonl_lines(path)]


def check_rows(path: str | os.PathLike, rows: list[tuple[int, Any]],
               fields: dict[str, tuple[type, ...]],
               check: Callable[[dict], None] | None = None) -> list[dict]:
    """The records of ``rows`` (`read_jsonl_lines`), each checked to be an object with
    every field of ``fields`` (name -> accepted types; a bool is not an int) and then by
    ``check`` (which raises ValueError).

    Raises:
      entr_jax.file_errors.BadFileError: ``<path>:<line>: ...`` naming the field, what it
        must be and what the row holds.
    """
    need = ", ".join(f"{k}: {'/'.join(t.__name__ for t in types)}" for k, types in fields.items())
    out = []
    for line, row in rows:
        if not isinstance(row, dict):
            raise BadFileError(path, f"a row must be a JSON object ({need}), got "
                                     f"{type(row).__name__}", line)
        for name, types in fields.items():
            if name not in row:
                raise BadFileError(path, f"field {name!r} is missing (each row needs {need})",
                                   line)
            value = row[name]
            if isinstance(value, bool) or not isinstance(value, types):
                raise BadFileError(path, f"field {name!r} must be "
                                         f"{'/'.join(t.__name__ for t in types)}, got "
                                         f"{type(value).__name__} {str(value)[:60]!r}", line)
        if check is not None:
            try:
                check(row)
            except ValueError as e:
                raise BadFileError(path, str(e), line) from None
        out.append(row)
    return out


def gsm8k_final_answer(solution: str) -> str:
    """The number after ``####`` in a GSM8K solution, commas removed (``"1,000"`` -> ``"1000"``)."""
    if "####" not in solution:
        raise ValueError(f"GSM8K solution has no '####' line: {solution[-80:]!r}")
    return solution.rsplit("####", 1)[1].strip().replace(",", "")


def read_data(key: str, data_dir: DataDir = None,
              fields: dict[str, tuple[type, ...]] | None = None,
              check: Callable[[dict], None] | None = None) -> list[dict]:
    """The rows of data file ``key`` (``"gsm8k/test.jsonl"``), found by `locate`, each
    checked to hold ``fields`` and to pass ``check`` (`check_rows`) when given.

    Raises:
      entr_jax.data.files.DataNotFoundError: (a FileNotFoundError) found nowhere; the
        message names ``--data.dir`` / ``ENTR_DATA_DIR``, the cache and the fetch command.
      entr_jax.file_errors.BadFileError: the file or one of its rows cannot be used
        (naming the file, the line and what is wrong).
    """
    path = locate(key, data_dir).path
    return check_rows(path, read_jsonl_lines(path), fields or {}, check)


_STR, _ID, _ANSWER = (str,), (int, str), (str, int, float)
GSM8K_FIELDS = {"question": _STR, "answer": _STR}
MATH500_FIELDS = {"unique_id": _STR, "problem": _STR, "answer": _STR, "solution": _STR,
                  "subject": _STR, "level": _ID}
COMPETITION_FIELDS = {"id": _ID, "problem": _STR, "answer": _ANSWER}


def load_gsm8k(split: str = "train", data_dir: DataDir = None) -> list[Example]:
    """GSM8K ``train`` (7473, ships with the package) or ``test`` (1319); extras:
    ``solution`` (worked solution)."""
    if split not in ("train", "test"):
        raise ValueError(f"load_gsm8k: split must be 'train' or 'test', got {split!r}")
    rows = read_data(f"gsm8k/{split}.jsonl", data_dir, GSM8K_FIELDS,
                     lambda r: gsm8k_final_answer(r["answer"]))
    return [
        {
            "id": f"gsm8k/{split}/{i}",
            "question": r["question"],
            "answer": gsm8k_final_answer(r["answer"]),
            "solution": r["answer"],
            "source": "gsm8k",
        }
        for i, r in enumerate(rows)
    ]


def load_math500(data_dir: DataDir = None) -> list[Example]:
    """MATH-500 (500): ``answer`` is LaTeX; extras ``solution``, ``subject``, ``level``."""
    rows = read_data("math500/test.jsonl", data_dir, MATH500_FIELDS)
    return [
        {
            "id": r["unique_id"],
            "question": r["problem"],
            "answer": r["answer"],
            "solution": r["solution"],
            "subject": r["subject"],
            "level": r["level"],
            "source": "math500",
        }
        for r in rows
    ]


def _number_to_str(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def load_aime24(data_dir: DataDir = None) -> list[Example]:
    """AIME 2024 (30); answers are 3-digit strings as published (``"025"``)."""
    rows = read_data("aime24/test.jsonl", data_dir, COMPETITION_FIELDS)
    return [
        {
            "id": f"aime24/{r['id']}",
            "question": r["problem"],
            "answer": _number_to_str(r["answer"]),
            "solution": r.get("solution", ""),
            "source": "aime24",
        }
        for r in rows
    ]


def load_amc23(data_dir: DataDir = None) -> list[Example]:
    """AMC 2023 (40); the file's float answers are written as integers when integral."""
    rows = read_data("amc23/test.jsonl", data_dir, COMPETITION_FIELDS)
    return [
        {
            "id": f"amc23/{r['id']}",
            "question": r["problem"],
            "answer": _number_to_str(r["answer"]),
            "source": "amc23",
        }
        for r in rows
    ]


# ---- calculator annotations ---------------------------------------------------------------

CALC_ANNOTATION_RE = re.compile(r"<<([^<>=]*)=([^<>]*)>>")
_SIMPLE_EXPR_RE = re.compile(r"^[0-9+\-*/(). ]+$")


def _hash_fraction(key: str) -> float:
    """A stable number in [0, 1) from a string (sha256; independent of PYTHONHASHSEED)."""
    return int(hashlib.sha256(key.encode()).hexdigest()[:12], 16) / 16**12


def gsm8k_arithmetic(
    split: str = "train",
    eval_fraction: float = 0.1,
    max_chars: int = 30,
    max_abs_result: int = 10**9,
    data_dir: DataDir = None,
) -> list[Example]:
    """Arithmetic problems from the ``<<expr=result>>`` annotations of GSM8K *train* (the
    split that ships with the package, so this source works offline).

    Filter (documented, applied in this order): the expression contains only digits,
    ``. + - * / ( )`` and spaces, has at most ``max_chars`` characters (spaces removed)
    and at least one operator; it evaluates exactly (`safe_eval`) to an *integer* of
    magnitude <= ``max_abs_result``; and the annotated result equals that value (rows
    whose annotation is inconsistent are dropped). Expressions are deduplicated after
    removing spaces (first occurrence kept, file order).

    Split: an expression goes to ``"eval"`` when ``sha256(expr)`` maps below
    ``eval_fraction``, else to ``"train"``; so the two splits never share an expression.

    Returns examples ``{"id": "gsm8k_arith/<expr>", "question": expr, "answer": str(int),
    "source": "gsm8k_arithmetic"}``.
    """
    if split not in ("train", "eval"):
        raise ValueError(f"gsm8k_arithmetic: split must be 'train' or 'eval', got {split!r}")
    if not 0 < eval_fraction < 1:
        raise ValueError(f"gsm8k_arithmetic: eval_fraction must be in (0, 1), got {eval_fraction}")
    limits = ArithLimits(max_chars=max_chars)
    seen: set[str] = set()
    out: list[Example] = []
    for row in read_data("gsm8k/train.jsonl", data_dir, GSM8K_FIELDS):
        for expr_raw, result_raw in CALC_ANNOTATION_RE.findall(row["answer"]):
            expr = expr_raw.replace(" ", "")
            if expr in seen or not _SIMPLE_EXPR_RE.match(expr) or len(expr) > max_chars:
                continue
            if not any(op in expr[1:] for op in "+-*/"):
                continue
            seen.add(expr)
            try:
                value = safe_eval(expr, limits)
                annotated = safe_eval(result_raw.replace(" ", ""), ArithLimits())
            except ArithmeticError_:
                continue
            if value.denominator != 1 or abs(value) > max_abs_result or annotated != value:
                continue
            is_eval = _hash_fraction(expr) < eval_fraction
            if is_eval == (split == "eval"):
                out.append(
                    {
                        "id": f"gsm8k_arith/{expr}",
                        "question": expr,
                        "answer": format_number(value),
                        "source": "gsm8k_arithmetic",
                    }
                )
    return out


SOURCES: dict[str, Callable[..., list[Example]]] = {
    "gsm8k": load_gsm8k,
    "math500": load_math500,
    "aime24": load_aime24,
    "amc23": load_amc23,
    "gsm8k_arithmetic": gsm8k_arithmetic,
    "reasoning_gym": reasoning_gym_source,
    "chain_sum": chain_sum_source,
}


FILE_SOURCES = frozenset({"gsm8k", "math500", "aime24", "amc23", "gsm8k_arithmetic"})
"""The sources read from data files (they take ``data_dir``)."""


def load_source(name: str, data_dir: DataDir = None, **kwargs: Any) -> list[Example]:
    """Loads a source by name (keys of `SOURCES`); kwargs go to its loader, ``data_dir``
    to the file-based ones (`FILE_SOURCES`; the others ignore it)."""
    if name not in SOURCES:
        raise ValueError(f"unknown data source {name!r}; known: {sorted(SOURCES)}")
    if name in FILE_SOURCES:
        kwargs["data_dir"] = data_dir
    return SOURCES[name](**kwargs)
