"""The per-token table of the decomposition (`experiments.analysis.decompose`) and what
both the report and its figures (`experiments.analysis.decompose_plots`) read from it: the
fixed entropy bins, the split into staleness- and mismatch-dominated tokens, every gate's
score."""

from __future__ import annotations

import dataclasses

import numpy as np

from experiments.analysis import gate_curves as gc

# fixed entropy bins (left edges; the last bin is open-ended)
ENTROPY_EDGES = (0.0, 0.01, 0.03, 0.1, 0.3, 1.0, 2.0, 3.0)
FIELDS = ("run", "step", "row", "entropy_mu", "entropy_pi", "logp_mu", "logp_pi",
          "logp_version", "delta", "delta_mis", "delta_stale", "age")


@dataclasses.dataclass(frozen=True)
class Decomposed:
    """Loss tokens of one or more runs, flattened; every field ``[N]``: ``run`` (int64 index
    into the runs given), ``step`` (int64), ``row`` (int64: the trajectory's row in its
    step), ``entropy_mu``, ``entropy_pi``, ``logp_mu``, ``logp_pi``, ``logp_version``
    (float64 from float32, nats), ``delta``, ``delta_mis``, ``delta_stale`` (float64 of
    the float32 differences), ``age`` (int64 versions; -1 when the step has no metrics
    row)."""

    run: np.ndarray
    step: np.ndarray
    row: np.ndarray
    entropy_mu: np.ndarray
    entropy_pi: np.ndarray
    logp_mu: np.ndarray
    logp_pi: np.ndarray
    logp_version: np.ndarray
    delta: np.ndarray
    delta_mis: np.ndarray
    delta_stale: np.ndarray
    age: np.ndarray

    def __len__(self) -> int:
        return len(self.delta)

    @property
    def q(self) -> np.ndarray:
        """``mu(o_t) = exp(logp_mu)``, the sampled token's behaviour probability."""
        return np.exp(self.logp_mu)

    def select(self, keep: np.ndarray) -> "Decomposed":
        return Decomposed(*(getattr(self, f)[keep] for f in FIELDS))


MATERIAL_NATS = 0.01  # |delta| above which a gate's decision about a token matters
# off-mode tokens below LOW_H against those at or above HIGH_H (nats): the low-entropy
# amplification of the mismatch, E[delta_mis^2 | off-mode, H < 0.1] / E[.. | H >= 1]
LOW_H, HIGH_H = 0.1, 1.0


def classify(t: Decomposed) -> tuple[np.ndarray, np.ndarray]:
    """``(stale, mis)`` ``[N] bool``: a token is *mismatch-dominated* when the mismatch
    accounts for more of its log-ratio than the drift does, ``|delta_mis| > |delta_stale|``,
    and *staleness-dominated* otherwise (``|delta_stale| >= |delta_mis|``); every token is
    in exactly one class."""
    mis = np.abs(t.delta_mis) > np.abs(t.delta_stale)
    return ~mis, mis


def scores(t: Decomposed, seq: dict[str, np.ndarray], eps: float = 0.01) -> dict[str, np.ndarray]:
    """Every gate's score per token (`experiments.analysis.gate_curves`)."""
    return {"entr": gc.score_entr(t.delta, t.entropy_mu, eps),
            "icepop": gc.score_icepop(t.delta),
            "kpop": gc.score_kpop(t.logp_pi, t.logp_mu),
            "trm": seq["trm"], "m2po": seq["m2po"],
            "tis": gc.score_tis(t.delta)}
