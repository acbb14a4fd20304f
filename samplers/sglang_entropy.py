"""Full-vocabulary entropy from the top-k log-probs an inference engine returns, with bounds.

ESTR (arXiv 2607.22186; ``docs/algorithms.md`` section 3, "Estimator" and
"Source") needs the *full-vocabulary* Shannon entropy ``H_t = -sum_w mu(w) log mu(w)`` of
the behavior distribution at every generated position. Stock SGLang returns only the
top-k log-probs of each position (``top_logprobs_num``), so the client estimates ``H_t``
from them and reports how far the estimate can be from the truth.

Derivation (no approximation beyond the top-k contract). Let ``p_1..p_k`` be the k largest
probabilities, ``p_min = min_i p_i``, ``m = 1 - sum_i p_i`` the tail mass, spread over the
other ``n = V - k`` tokens as ``q_1..q_n`` with ``sum_j q_j = m`` and ``0 <= q_j <= p_min``
(they are not among the top k). With ``h(x) = -x log x`` (``h(0) = 0``),

    H = H_top + H_tail,   H_top = sum_i h(p_i),   H_tail = sum_j h(q_j).

* Upper bound (Jensen, ``h`` concave): ``H_tail <= n h(m / n) = -m log(m / n)``, reached
  by the uniform tail.
* Lower bound (Schur concavity of entropy): over the polytope ``{0 <= q_j <= p_min,
  sum q_j = m}`` the minimum of ``sum_j h(q_j)`` is at its majorization-maximal vertex:
  ``c = floor(m / p_min)`` entries equal to ``p_min`` and one entry ``r = m - c p_min``,
  so ``H_tail >= c h(p_min) + h(r)``. When the data are inconsistent with the top-k
  contract (``m > n p_min``, e.g. rounding) the unconstrained bound ``H_tail >= h(m)``
  (all tail mass on one token) is used instead; it always holds.

The estimate is the midpoint of ``[H_top + lo, H_top + hi]``, the minimax choice, so
``|estimate - H| <= (hi - lo) / 2`` (the reported half-width). The bound is exact for
exact inputs; engine log-probs carry their own rounding (bf16 logits), which can make
``sum p_i`` exceed 1 by a little: ``m`` is then clipped to 0.
"""

from __future__ import annotations

import numpy as np


def _h(x: np.ndarray) -> np.ndarray:
    """``-x log x`` elementwise with ``h(0) = 0`` (float64)."""
    x = np.asarray(x, np.float64)
    safe = np.where(x > 0, x, 1.0)
    return np.where(x > 0, -x * np.log(safe), 0.0)


def topk_entropy_bounds(
    top_logprobs_RK: np.ndarray, vocab_size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Entropy estimate and bounds from the top-k log-probs of each position.

    Args:
      top_logprobs_RK: ``[R, K]`` float, natural-log probabilities of the K most likely
        tokens of each of R positions (any order). ``-inf`` or NaN entries mean "not
        reported" (a position with fewer than K entries); a row with none gives NaN.
      vocab_size: V, the full vocabulary size (``> K``).

    Returns:
      ``(estimate_R, lower_R, upper_R)`` float64 nats with ``lower <= H <= upper`` for the
      true full-vocabulary entropy H and ``estimate = (lower + upper) / 2``.

    Raises:
      ValueError: if ``top_logprobs_RK`` is not 2-D or ``vocab_size <= K``.
    """
    lp = np.asarray(top_logprobs_RK, np.float64)
    if lp.ndim != 2:
        raise ValueError(f"top_logprobs_RK must be [R, K], got shape {lp.shape}")
    if vocab_size <= lp.shape[1]:
        raise ValueError(f"vocab_size ({vocab_size}) must exceed K ({lp.shape[1]})")
    present = np.isfinite(lp)
    p = np.where(present, np.exp(np.where(present, lp, 0.0)), 0.0)
    k_R = present.sum(axis=1)
    h_top = _h(p).sum(axis=1)
    m = np.clip(1.0 - p.sum(axis=1), 0.0, 1.0)
    n = (vocab_size - k_R).astype(np.float64)
    p_min = np.where(present, p, np.inf).min(axis=1)
    p_min = np.where(np.isfinite(p_min) & (p_min > 0), p_min, 1.0)

    upper_tail = np.where(m > 0, -m * np.log(np.where(m > 0, m, 1.0) / n), 0.0)
    c = np.floor(m / p_min)
    r = np.clip(m - c * p_min, 0.0, None)
    feasible = m <= n * p_min
    lower_tail = np.where(feasible, c * _h(p_min) + _h(r), _h(m))
    lower_tail = np.minimum(lower_tail, upper_tail)

    empty = k_R == 0
    lower = np.where(empty, np.nan, h_top + lower_tail)
    upper = np.where(empty, np.nan, h_top + upper_tail)
    return 0.5 * (lower + upper), lower, upper
