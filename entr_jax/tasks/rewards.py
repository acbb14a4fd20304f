"""Answer extraction and equivalence checking (math-verify with an enforced time limit).

Extraction (`extract_answer`) takes, from a model response, the text after the *last*
``#### `` marker or inside the *last* ``\\boxed{...}`` (nested braces handled), whichever
comes later, and optionally falls back to the last number in the text.

Equivalence (`MathVerifier`):

1. fast path: when both strings are plain decimal numbers (``-1,234.50``, ``025``,
   ``27.0``) they are compared exactly as rationals, without math-verify;
2. otherwise both are wrapped as ``\\boxed{...}`` and given to ``math_verify.parse`` /
   ``math_verify.verify`` (Hugging Face math-verify) with math-verify's own signal-based
   timeouts turned off (``parsing_timeout=None``, ``timeout_seconds=None``: they rely on
   ``signal.alarm`` and fail off the main thread). The time limit is enforced here instead,
   with a ``pebble.ProcessPool`` of ``num_workers`` spawned worker processes:

   * a worker starts (imports math-verify and runs one warm-up check) *before* it takes
     any answer, and each answer's ``timeout_s`` clock starts when a worker picks it up,
     so start-up and queueing never count against an answer's limit;
   * an answer still running after ``timeout_s`` seconds scores 0 and is counted once in
     ``MathVerifier.num_timeouts``; only its worker is killed, and the pool replaces it
     while the other workers go on with their answers;
   * an exception inside math-verify, or a worker that dies, scores that answer 0 and is
     counted in ``num_errors``.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import multiprocessing
import re
from fractions import Fraction
from typing import Sequence

import pebble

_NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")
_PLAIN_NUMBER_RE = re.compile(r"^[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d*)?$")
_HASH_RE = re.compile(r"####\s*([^\n]*)")


@dataclasses.dataclass(frozen=True)
class Extraction:
    """An extracted final answer.

    Attributes:
      text: the answer string (stripped), or None when nothing was found.
      method: ``"boxed"``, ``"hash"``, ``"last_number"`` or ``"none"``.
    """

    text: str | None
    method: str


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), nested braces handled.

    Returns None when there is no complete boxed expression.
    """
    starts = [m.end() for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text)]
    for start in reversed(starts):
        depth = 1
        for i in range(start, len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    return text[start:i].strip()
    return None


def _clean_hash_answer(raw: str) -> str:
    answer = raw.strip().rstrip(".").strip()
    if answer.startswith("$") and not answer.endswith("$"):
        answer = answer[1:].strip()
    return answer


def last_number(text: str) -> str | None:
    """The last decimal number in ``text`` (commas kept; the verifier removes them)."""
    found = _NUMBER_RE.findall(text)
    return found[-1].rstrip(",") if found else None


def extract_answer(text: str, fallback_last_number: bool = True) -> Extraction:
    """Extracts the final answer of a response.

    The later of the last ``#### <answer>`` (rest of that line, trailing period and a
    leading ``$`` removed) and the last ``\\boxed{<answer>}`` wins; with
    ``fallback_last_number`` the last number in the text is used when neither exists.
    """
    if not isinstance(text, str):
        raise TypeError(f"extract_answer: text must be str, got {type(text).__name__}")
    hash_matches = list(_HASH_RE.finditer(text))
    hash_pos = hash_matches[-1].start() if hash_matches else -1
    boxed_pos = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    boxed = last_boxed(text) if boxed_pos >= 0 else None
    if boxed is not None and boxed_pos > hash_pos:
        return Extraction(boxed, "boxed")
    if hash_matches:
        answer = _clean_hash_answer(hash_matches[-1].group(1))
        if answer:
            return Extraction(answer, "hash")
    if boxed is not None:
        return Extraction(boxed, "boxed")
    if fallback_last_number:
        number = last_number(text)
        if number is not None:
            return Extraction(number, "last_number")
    return Extraction(None, "none")


def parse_plain_number(text: str) -> Fraction | None:
    """Exact value of a plain decimal string (``"1,234.5"``, ``"-025"``, ``"$18"``), else None."""
    s = text.strip().replace("\\$", "").lstrip("$").replace("\\!", "").replace(" ", "")
    if not s or not _PLAIN_NUMBER_RE.match(s) or not any(c.isdigit() for c in s):
        return None
    return Fraction(s.replace(",", ""))


# ---- math-verify, run in worker processes -------------------------------------------------


def _mv_check(gold: str, pred: str) -> bool:
    """One math-verify equivalence check (module-level so spawned workers can import it)."""
    import math_verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    gold_parsed = math_verify.parse("\\boxed{" + gold + "}", parsing_timeout=None)
    pred_parsed = math_verify.parse("\\boxed{" + pred + "}", parsing_timeout=None)
    if not gold_parsed or not pred_parsed:
        return False
    return bool(math_verify.verify(gold_parsed, pred_parsed, timeout_seconds=None))


def _warm_up_worker() -> None:
    """Worker initializer: import math-verify and run one check, so the first answer a
    worker takes does not pay for the imports (sympy, latex2sympy) within its limit.

    It never raises (a failing initializer would make the pool respawn the worker
    forever); a broken install then shows up as an error on every answer."""
    try:
        _mv_check("\\frac{1}{2}", "0.5")
    except Exception:  # noqa: BLE001 - reported per answer by the checks themselves
        pass


@dataclasses.dataclass(frozen=True)
class VerifierConfig:
    """Configuration of `MathVerifier`.

    Attributes:
      timeout_s: wall-clock limit per math-verify check (seconds, > 0), counted from when a
        worker starts on the answer (start-up and queueing excluded).
      num_workers: worker processes checking answers in parallel (>= 1).
      fast_path: compare plain decimal numbers exactly without math-verify.
    """

    timeout_s: float = 5.0
    num_workers: int = 1
    fast_path: bool = True

    def __post_init__(self):
        if isinstance(self.timeout_s, bool) or not self.timeout_s > 0:
            raise ValueError(f"verifier.timeout_s must be > 0, got {self.timeout_s!r}")
        if (isinstance(self.num_workers, bool) or not isinstance(self.num_workers, int)
                or self.num_workers < 1):
            raise ValueError(f"verifier.num_workers must be an int >= 1, got {self.num_workers!r}")


class MathVerifier:
    """Judges whether predicted answers equal gold answers (see the module docstring).

    Counters (read them for metrics): ``num_checks``, ``num_fast_path``,
    ``num_worker_checks`` (answers sent to a math-verify worker), ``num_timeouts``
    (answers that ran past ``timeout_s``; they score 0), ``num_errors`` (exceptions inside
    math-verify or a worker that died; they score 0).
    The worker pool starts lazily on the first check that needs math-verify and lives
    until `close` (or the end of a ``with`` block); timed-out workers are replaced inside
    it.
    """

    def __init__(self, config: VerifierConfig = VerifierConfig()):
        self.config = config
        self._pool = None
        self.num_checks = 0
        self.num_fast_path = 0
        self.num_worker_checks = 0
        self.num_timeouts = 0
        self.num_errors = 0

    def __enter__(self) -> "MathVerifier":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stops the worker pool (a later check starts a new one)."""
        if self._pool is not None:
            self._pool.stop()
            self._pool.join()
            self._pool = None

    def _get_pool(self) -> pebble.ProcessPool:
        if self._pool is None:
            self._pool = pebble.ProcessPool(
                max_workers=self.config.num_workers, initializer=_warm_up_worker,
                context=multiprocessing.get_context("spawn"))
        return self._pool

    def equivalent(self, gold: str, pred: str | None) -> bool:
        """Whether ``pred`` equals ``gold`` (None / empty prediction: False)."""
        return self.equivalent_batch([(gold, pred)])[0]

    def equivalent_batch(self, pairs: Sequence[tuple[str, str | None]]) -> list[bool]:
        """`equivalent` over ``(gold, pred)`` pairs; math-verify checks run in parallel."""
        results: list[bool | None] = []
        pending: list[int] = []
        for gold, pred in pairs:
            if not isinstance(gold, str):
                raise TypeError(f"gold answer must be str, got {type(gold).__name__}")
            self.num_checks += 1
            if pred is None or not str(pred).strip():
                results.append(False)
                continue
            if self.config.fast_path:
                g, p = parse_plain_number(gold), parse_plain_number(pred)
                if g is not None and p is not None:
                    self.num_fast_path += 1
                    results.append(g == p)
                    continue
            results.append(None)
            pending.append(len(results) - 1)
        if pending:
            self.num_worker_checks += len(pending)
            pool = self._get_pool()
            futures = [pool.schedule(_mv_check, (pairs[i][0], str(pairs[i][1])),
                                     timeout=self.config.timeout_s) for i in pending]
            for i, future in zip(pending, futures):
                results[i] = self._outcome(future)
        return [bool(r) for r in results]

    def _outcome(self, future: concurrent.futures.Future) -> bool:
        """The verdict of one scheduled check; a timeout or an error scores 0."""
        try:
            return bool(future.result())
        except TimeoutError:  # pebble killed the worker at timeout_s
            self.num_timeouts += 1
        except Exception:  # noqa: BLE001 - math-verify raised or the worker died
            self.num_errors += 1
        return False


@dataclasses.dataclass(frozen=True)
class RewardConfig:
    """Sequence reward ``R = correct + format_weight * formatted``.

    Attributes:
      format_weight: weight of the format term (>= 0); ``formatted`` is 1 when the answer
        was given with ``####`` or ``\\boxed{}`` (not found only as a last number).
      fallback_last_number: accept the last number as the answer when no marker exists.
    """

    format_weight: float = 0.0
    fallback_last_number: bool = False

    def __post_init__(self):
        if self.format_weight < 0:
            raise ValueError(f"RewardConfig.format_weight must be >= 0, got {self.format_weight}")


def math_reward(
    response: str, gold: str, verifier: MathVerifier, config: RewardConfig = RewardConfig()
) -> tuple[float, dict]:
    """Reward of one response against its gold answer.

    Returns ``(reward, info)`` with info keys ``pred`` (extracted answer or None),
    ``method`` (extraction method) and ``correct`` (bool).
    """
    extraction = extract_answer(response, config.fallback_last_number)
    correct = verifier.equivalent(gold, extraction.text)
    formatted = extraction.method in ("boxed", "hash")
    reward = float(correct) + config.format_weight * float(formatted)
    return reward, {"pred": extraction.text, "method": extraction.method, "correct": correct}


class MathScorer:
    """Scorer ``(response, example) -> (reward, info)`` against ``example["answer"]``.

    The environment-side form of `math_reward` (see `entr_jax.tasks.env.Scorer`).
    """

    def __init__(self, verifier: MathVerifier, config: RewardConfig = RewardConfig()):
        self.verifier = verifier
        self.config = config

    def __call__(self, response: str, example: dict) -> tuple[float, dict]:
        return math_reward(response, str(example["answer"]), self.verifier, self.config)
