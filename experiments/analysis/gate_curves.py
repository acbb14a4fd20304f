"""Where each gate cuts, as a score and a threshold: gate curves over the decomposition.

Every gate studied here keeps a token iff a per-token *score* ``s`` is at most the gate's
threshold ``theta`` (non-strict), so one sort gives the gate's decision at every
threshold. The scores reproduce the decisions of `entr_jax.objectives.gates` exactly
(tests compare them token by token), with ``delta = logp_pi - logp_mu`` in float32 as the
learner computes it:

=========  ===================================================  ===========================
gate       score ``s``                                          threshold (default)
=========  ===================================================  ===========================
entr       ``delta^2 / (max(H, 0) + eps)``                      ``tau`` (1.0)
icepop     ``max(-delta / ln(1/alpha0), delta / ln(beta0))``    band scale ``c`` (1.0: the
           (band ``[alpha0^c, beta0^c]``; alpha0, beta0 =       published band)
           0.5, 5)
kpop       ``max(D(p||q), D(q||p))``, p = pi(o_t), q = mu(o_t)   ``phi`` (2.0)
trm        the row's ``max_t delta_t^2 / 2`` (criterion max)     ``threshold`` (0.05)
m2po       ``min_{k <= r} mean(sorted delta^2 [k:])`` for the    ``tau`` (0.04)
           token of rank r (descending ``delta^2``) in its step
tis        ``exp(delta_prox)``, ``delta_prox = logp_pi - logp_mu`` cap ``C`` (2.0); a token
           (prox = the policy before the step's first update)   "cut" = its weight truncated
=========  ===================================================  ===========================

A *gate curve* (a ROC curve) sweeps the threshold from +inf down: x = share of
staleness-dominated tokens cut, y = share of mismatch-dominated tokens cut (the classes of
`experiments.analysis.decompose.classify`). ESTR's mechanism (arXiv 2607.22186, Sec. 3)
predicts that ENTR's curve lies above the others: for the same damage to ordinary
drift it removes more train-inference noise.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import numpy as np

from entr_jax.objectives.common import LOG_RATIO_CLIP

GATES = ("entr", "icepop", "kpop", "trm", "m2po", "tis")
# each gate's published / project default threshold, in its score's units
DEFAULTS = {"entr": 1.0, "icepop": 1.0, "kpop": 2.0, "trm": 0.05, "m2po": 0.04, "tis": 2.0}
ICEPOP_BAND = (0.5, 5.0)  # alpha0, beta0 of the band family (IcePop's published band)


def _f32_delta(logp_pi: np.ndarray, logp_mu: np.ndarray) -> np.ndarray:
    return np.asarray(logp_pi, np.float32) - np.asarray(logp_mu, np.float32)


def score_entr(delta: np.ndarray, entropy_mu: np.ndarray, eps: float = 0.01) -> np.ndarray:
    """``delta^2 / (max(H, 0) + eps)`` in float64 from float32 inputs (`gates.entr_mask`
    keeps iff ``delta^2 <= tau (max(H,0) + eps)`` in float32; the two agree except within
    float32 rounding of the boundary)."""
    d = np.clip(np.asarray(delta, np.float32), -LOG_RATIO_CLIP, LOG_RATIO_CLIP).astype(np.float64)
    h = np.maximum(np.asarray(entropy_mu, np.float32), 0.0).astype(np.float64)
    return d * d / np.maximum(h + eps, 1e-30)


def score_icepop(delta: np.ndarray, band: tuple[float, float] = ICEPOP_BAND) -> np.ndarray:
    """Smallest band scale ``c`` whose band ``[alpha0^c, beta0^c]`` holds ``exp(delta)``."""
    a0, b0 = band
    d = np.asarray(delta, np.float64)
    return np.maximum(-d / math.log(1.0 / a0), d / math.log(b0))


def _binary_kl(lp: np.ndarray, lq: np.ndarray) -> np.ndarray:
    """Bernoulli KL from log-probs in float64 (`gates.binary_kl`'s formula)."""
    lp, lq = np.clip(lp, -1e4, 0.0), np.clip(lq, -1e4, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        l1p, l1q = np.log(-np.expm1(lp)), np.log(-np.expm1(lq))
        t2 = np.where(np.isfinite(l1p), np.exp(l1p) * (l1p - l1q), 0.0)
    return np.exp(lp) * (lp - lq) + t2


def score_kpop(logp_pi: np.ndarray, logp_mu: np.ndarray) -> np.ndarray:
    """``max(D(p||q), D(q||p))`` of the sampled token's train / inference probabilities."""
    lp, lq = np.asarray(logp_pi, np.float64), np.asarray(logp_mu, np.float64)
    return np.maximum(_binary_kl(lp, lq), _binary_kl(lq, lp))


def score_trm(delta_BT: np.ndarray, loss_mask_BT: np.ndarray) -> np.ndarray:
    """``[B, T]``: each row's ``max_t delta^2 / 2`` over its loss tokens, on every token."""
    d = np.clip(np.asarray(delta_BT, np.float32), -LOG_RATIO_CLIP, LOG_RATIO_CLIP).astype(np.float64)
    row = np.max(np.where(loss_mask_BT, 0.5 * d * d, 0.0), axis=1)
    return np.broadcast_to(row[:, None], d.shape).copy()


def score_m2po(delta: np.ndarray) -> np.ndarray:
    """``[N]`` (the loss tokens of one optimizer batch): the smallest M2PO bound ``tau`` that
    keeps each token (`gates.m2po_mask`: reject the smallest prefix of the descending
    ``delta^2`` whose removal brings the mean of the rest to ``<= tau``)."""
    d = np.clip(np.asarray(delta, np.float32), -LOG_RATIO_CLIP, LOG_RATIO_CLIP).astype(np.float64)
    sq = d * d
    order = np.argsort(-sq, kind="stable")
    s = sq[order]
    suffix_mean = np.cumsum(s[::-1])[::-1] / np.arange(len(s), 0, -1)
    crit = np.minimum.accumulate(suffix_mean)
    out = np.empty_like(sq)
    out[order] = crit
    return out


def score_tis(delta: np.ndarray) -> np.ndarray:
    """The truncated-IS weight before truncation, ``exp(delta_prox)``."""
    return np.exp(np.clip(np.asarray(delta, np.float64), -LOG_RATIO_CLIP, LOG_RATIO_CLIP))


@dataclasses.dataclass(frozen=True)
class Curve:
    """One gate's curve: ``thresholds`` (descending) and the cut shares at each:
    ``x`` (staleness-dominated), ``y`` (mismatch-dominated), ``all`` (every token)."""

    gate: str
    thresholds: np.ndarray
    x: np.ndarray
    y: np.ndarray
    all: np.ndarray

    def at_threshold(self, theta: float) -> dict[str, float]:
        """Cut shares at threshold ``theta`` (a token is cut iff its score > theta): those
        of the largest listed threshold ``<= theta``, which cuts the same tokens."""
        i = int(np.searchsorted(-self.thresholds, -theta, side="left"))
        return {"threshold": float(theta), "x": float(self.x[i]), "y": float(self.y[i]),
                "all": float(self.all[i])}

    def y_at_x(self, x: float) -> float:
        """Most mismatch-dominated share cut while cutting at most ``x`` of the
        staleness-dominated tokens."""
        ok = self.x <= x + 1e-12
        return float(np.max(self.y[ok])) if ok.any() else 0.0

    def threshold_at_x(self, x: float) -> float:
        """The smallest threshold that cuts at most ``x`` of the staleness-dominated tokens
        (the most aggressive setting within that budget)."""
        ok = self.x <= x + 1e-12
        return float(np.min(self.thresholds[ok])) if ok.any() else float("inf")

    def all_at_y(self, y: float) -> float:
        """Share of all tokens cut at the least aggressive threshold that cuts at least
        ``y`` of the mismatch-dominated tokens (NaN if none reaches ``y``)."""
        ok = self.y >= y - 1e-12
        return float(np.min(self.all[ok])) if ok.any() else float("nan")

    def auc(self) -> float:
        """Area under y(x) from (0, 0) to (1, 1) (trapezoids)."""
        x = np.concatenate([[0.0], self.x, [1.0]])
        y = np.concatenate([[0.0], self.y, [1.0]])
        return float(np.sum(np.diff(x) * (y[1:] + y[:-1]) / 2))


def curve(gate: str, score: np.ndarray, stale: np.ndarray, mis: np.ndarray) -> Curve:
    """The gate curve of ``score`` ``[N]`` over the classes ``stale``/``mis`` (``[N] bool``):
    one point per distinct finite score (cut iff score > threshold), plus threshold +inf
    (only the non-finite scores cut: they are always cut) and -inf (everything cut)."""
    score = np.where(np.isfinite(score), score, np.inf)
    order = np.argsort(-score, kind="stable")
    s = score[order]
    # cut_x[k]: tokens of class x among the first k of the descending order
    cut_s = np.concatenate([[0], np.cumsum(stale[order])])
    cut_m = np.concatenate([[0], np.cumsum(mis[order])])
    # threshold s[i] (finite) cuts the tokens with score > s[i]: the first k of them, k
    # the first position of the value s[i]; threshold +inf cuts the non-finite scores
    finite = np.isfinite(s)
    firsts = np.unique(np.searchsorted(-s, -s[finite], side="left"))
    ks = np.concatenate([[int(np.sum(~finite))], firsts, [len(s)]]).astype(int)
    thresholds = np.concatenate([[np.inf], s[firsts], [-np.inf]])
    ns, nm = max(int(stale.sum()), 1), max(int(mis.sum()), 1)
    return Curve(gate, thresholds, cut_s[ks] / ns, cut_m[ks] / nm, ks / max(len(s), 1))


def key_points(c: Curve, xs: Sequence[float] = (0.005, 0.01, 0.02, 0.05),
               ys: Sequence[float] = (0.5, 0.8, 0.9), grid: Sequence[float] = ()) -> dict[str, Any]:
    """A curve's summary for reports: AUC, y and the threshold at each budget ``x`` of
    staleness-dominated cuts, the share of all tokens cut at each recall ``y`` of
    mismatch-dominated tokens, and the shares at the gate's default and at ``grid``."""
    return {
        "auc": c.auc(),
        "y_at_x": {f"{x:g}": c.y_at_x(x) for x in xs},
        "threshold_at_x": {f"{x:g}": c.threshold_at_x(x) for x in xs},
        "all_at_y": {f"{y:g}": c.all_at_y(y) for y in ys},
        "default": c.at_threshold(DEFAULTS[c.gate]),
        "grid": [c.at_threshold(t) for t in grid],
    }


def matched_recall_table(gates: dict[str, Any], ys: Sequence[float] = (0.5, 0.8, 0.9)) -> str:
    """Markdown table of `experiments.analysis.decompose.gate_report` output ``gates``: per
    gate, the AUC and the share of *all* tokens it masks when its threshold is set to cut
    a share ``y`` of the mismatch-dominated tokens (mask fractions at matched recall; a
    smaller share is a sharper detector of mismatch), over every token and over the
    material ones (``gates["material"]``; "-" where a class is empty), and the cut shares at
    the gate's default (stale / mismatch / all), in percent."""
    pct = lambda v: "-" if v is None or not math.isfinite(v) else f"{100 * v:.2f}"  # noqa: E731
    at = lambda p: " / ".join(pct(p["all_at_y"].get(f"{y:g}")) for y in ys) if p else "-"  # noqa: E731
    recall = " / ".join(f"{100 * y:g}" for y in ys)
    lines = [f"| gate | AUC | % of all tokens cut at {recall} % recall | material AUC | "
             f"material: % cut at {recall} % recall | default: % stale / mis / all cut |",
             "|---|---|---|---|---|---|"]
    for g, kp in gates["overall"].items():
        mat = gates.get("material", {}).get(g)
        d, mat_auc = kp["default"], f"{mat['auc']:.3f}" if mat else "-"
        lines.append(f"| {g} | {kp['auc']:.3f} | {at(kp)} | {mat_auc} | {at(mat)} | "
                     f"{pct(d['x'])} / {pct(d['y'])} / {pct(d['all'])} |")
    return "\n".join(lines)
