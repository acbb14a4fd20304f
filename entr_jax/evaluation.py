"""Evaluation metrics: avg@k and the unbiased pass@k, per benchmark, written as JSON.

pass@k (Chen et al. 2021, "Evaluating Large Language Models Trained on Code",
arXiv 2107.03374, Eq. 1): with ``n`` samples of which ``c`` are correct,

    pass@k = 1 - C(n - c, k) / C(n, k),

computed stably as ``1 - prod_{i = n - c + 1}^{n} (1 - k / i)`` (and 1 when
``n - c < k``), without large binomials. avg@k is the mean correctness over all ``n``
samples of an example (mean over examples), i.e. the expected pass@1 of a sample.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Mapping, Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one example with ``n`` samples, ``c`` correct (see module docstring).

    Raises:
      ValueError: unless ``0 <= c <= n`` and ``1 <= k <= n``.
    """
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: need 0 <= c <= n, got c={c}, n={n}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: need 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def benchmark_metrics(
    correct: Sequence[Sequence[bool]],
    ks: Sequence[int] = (1,),
    greedy: Sequence[bool] | None = None,
) -> dict[str, float]:
    """Metrics of one benchmark from per-example lists of sampled correctness.

    Args:
      correct: ``correct[i]`` is the list of n_i >= 1 correctness flags of example i's
        sampled responses.
      ks: the k of ``pass@k`` (each must be <= every n_i).
      greedy: optional per-example correctness of one greedy (temperature 0) response.

    Returns:
      ``{"num_examples", "num_samples" (total), "avg@n" (mean correctness over all samples
      of an example, averaged over examples), "pass@k" for each k, "greedy" (accuracy,
      only when given)}``.
    """
    if not correct:
        raise ValueError("benchmark_metrics: correct must not be empty")
    if any(len(c) == 0 for c in correct):
        raise ValueError("benchmark_metrics: every example needs at least one sample")
    out: dict[str, float] = {
        "num_examples": len(correct),
        "num_samples": sum(len(c) for c in correct),
        "avg@n": sum(sum(map(bool, c)) / len(c) for c in correct) / len(correct),
    }
    for k in ks:
        out[f"pass@{k}"] = sum(pass_at_k(len(c), sum(map(bool, c)), k) for c in correct) / len(
            correct
        )
    if greedy is not None:
        if len(greedy) != len(correct):
            raise ValueError(
                f"benchmark_metrics: greedy has {len(greedy)} entries, correct has {len(correct)}"
            )
        out["greedy"] = sum(map(bool, greedy)) / len(greedy)
    return out


def evaluate(
    results: Mapping[str, Sequence[Sequence[bool]]],
    ks: Sequence[int] = (1,),
    greedy: Mapping[str, Sequence[bool]] | None = None,
) -> dict[str, dict[str, float]]:
    """`benchmark_metrics` for every benchmark name in ``results``."""
    greedy = greedy or {}
    return {name: benchmark_metrics(c, ks, greedy.get(name)) for name, c in results.items()}


def write_eval_json(path: str | os.PathLike, metrics: Mapping, step: int | None = None) -> None:
    """Writes ``{"step": step, "metrics": metrics}`` as JSON (parents created; NaN rejected)."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"step": step, "metrics": metrics}
    text = json.dumps(payload, indent=2, sort_keys=True, allow_nan=False)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text + "\n")
    os.replace(tmp, path)


__all__ = ["pass_at_k", "benchmark_metrics", "evaluate", "write_eval_json"]
