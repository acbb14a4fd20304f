"""The ratio-vs-entropy analysis of ESTR (arXiv 2607.22186, section 3.1) on stored token
samples, and where the ENTR, IcePop and KPop gates cut.

Conventions: ``delta = logp_pi - logp_mu`` is the log importance ratio of the current
policy to the behavior policy on a sampled token (nats); ``H = entropy_mu`` is the
full-vocabulary entropy of the behavior distribution at that position (nats). Token
arrays are flat ``[N]`` over loss tokens only.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterable, Sequence

import numpy as np

from experiments.analysis.runs import Run

# binary entropy h(0.02) = -0.02 ln 0.02 - 0.98 ln 0.98 = 0.098 nats: below it the mode of
# the behavior distribution has probability > 0.98 (see `off_mode_outliers`).
LOW_ENTROPY_NATS = 0.098

@dataclasses.dataclass(frozen=True)
class Tokens:
    """Loss tokens of a run's ``token_samples/step_<n>.npz`` files, flattened.

    Every field is ``[N]``: ``delta = logp_pi - logp_mu`` (computed in float32 like the
    learner, stored float64), ``entropy_mu``, ``entropy_pi``, ``logp_mu``, ``logp_pi``
    (float64, nats), ``step`` (int64: the learner step n the sample was taken before) and
    ``staleness`` (float64: learner version at step n minus ``token_version``; NaN when
    the step has no metrics row).
    """

    delta: np.ndarray
    entropy_mu: np.ndarray
    entropy_pi: np.ndarray
    logp_mu: np.ndarray
    logp_pi: np.ndarray
    step: np.ndarray
    staleness: np.ndarray

    def __len__(self) -> int:
        return len(self.delta)

    def select(self, keep: np.ndarray) -> "Tokens":
        """The tokens where the ``[N] bool`` array ``keep`` is true."""
        return Tokens(*(getattr(self, f.name)[keep] for f in dataclasses.fields(self)))


def concat_tokens(parts: Sequence[Tokens]) -> Tokens:
    """The tokens of several `Tokens` (e.g. of several runs) in one; ValueError when empty."""
    if not parts:
        raise ValueError("concat_tokens: no Tokens given")
    return Tokens(*(np.concatenate([getattr(t, f.name) for t in parts]) for f in dataclasses.fields(Tokens)))


def load_tokens(run: Run, steps: Iterable[int] | None = None) -> Tokens:
    """Loss tokens of ``token_samples/step_<n>.npz`` (all stored steps, or ``steps``).
    Raises FileNotFoundError naming the directory when no sample file matches."""
    files = {int(p.stem.split("_")[1]): p for p in (run.path / "token_samples").glob("step_*.npz")}
    wanted = sorted(files) if steps is None else sorted(set(steps) & set(files))
    if not wanted:
        raise FileNotFoundError(f"load_tokens: no token samples for steps {steps} in "
                                f"{run.path / 'token_samples'}")
    version = {m["step"]: m["version"] for m in run.metrics}
    parts: dict[str, list[np.ndarray]] = {f.name: [] for f in dataclasses.fields(Tokens)}
    for n in wanted:
        with np.load(files[n]) as z:
            mask = z["loss_mask"].astype(bool)
            lp, lmu = z["logp_pi"][mask], z["logp_mu"][mask]
            parts["delta"].append((lp.astype(np.float32) - lmu.astype(np.float32)).astype(np.float64))
            for k in ("entropy_mu", "entropy_pi", "logp_mu", "logp_pi"):
                parts[k].append(z[k][mask].astype(np.float64))
            parts["step"].append(np.full(mask.sum(), n, np.int64))
            v = version.get(n, np.nan)
            parts["staleness"].append(v - z["token_version"][mask].astype(np.float64))
    return Tokens(**{k: np.concatenate(v) for k, v in parts.items()})


def quantile_edges(entropy: np.ndarray, n_bins: int) -> np.ndarray:
    """Left bin edges at the ``k / n_bins`` quantiles of ``entropy`` (k = 0..n_bins-1),
    the first set to ``min(0, min entropy)`` so no token falls below it; duplicate edges
    merged. Use with `bin_by_entropy` (the last bin is open-ended)."""
    if n_bins < 1:
        raise ValueError(f"quantile_edges: n_bins must be >= 1, got {n_bins}")
    e = np.quantile(np.asarray(entropy, np.float64), np.arange(n_bins) / n_bins)
    e[0] = min(0.0, float(np.min(entropy)))
    return np.unique(e)


def bin_by_entropy(delta: np.ndarray, entropy: np.ndarray, edges: Sequence[float]) -> dict[str, np.ndarray]:
    """Second moment of the log-ratio per entropy bin (ESTR section 3.1: ``E[delta^2] ~ H``).

    Bin ``i`` holds tokens with ``edges[i] <= H < edges[i+1]``; the last bin is open-ended
    (``H >= edges[-1]``), tokens below ``edges[0]`` are dropped; the convention of
    `entr_jax.metrics.ratio_by_entropy_bucket`. Returns ``[K]`` arrays (K = len(edges)):
    ``count`` (int64), ``entropy_mean``, ``delta_sq_mean`` = mean of ``delta^2``,
    ``delta_sq_sem`` = sample std of ``delta^2`` / sqrt(count) (NaN when count < 2; means
    NaN when count = 0).
    """
    d2, h = np.asarray(delta, np.float64) ** 2, np.asarray(entropy, np.float64)
    edges = np.asarray(edges, np.float64)
    if edges.ndim != 1 or len(edges) < 1 or np.any(np.diff(edges) <= 0):
        raise ValueError(f"bin_by_entropy: edges must be a non-empty increasing 1-D sequence, got {edges}")
    idx = np.searchsorted(edges, h, side="right") - 1  # -1: below the first edge
    out = {k: np.full(len(edges), np.nan) for k in ("entropy_mean", "delta_sq_mean", "delta_sq_sem")}
    out["count"] = np.zeros(len(edges), np.int64)
    for i in range(len(edges)):
        sel = idx == i
        n = int(sel.sum())
        out["count"][i] = n
        if n:
            out["entropy_mean"][i] = h[sel].mean()
            out["delta_sq_mean"][i] = d2[sel].mean()
        if n > 1:
            out["delta_sq_sem"][i] = d2[sel].std(ddof=1) / math.sqrt(n)
    return out


@dataclasses.dataclass(frozen=True)
class Fit:
    """``y ~ slope * x + intercept`` with standard errors (intercept 0 and its se NaN when
    fitted through the origin); ``dof`` = points - parameters."""

    slope: float
    intercept: float
    slope_se: float
    intercept_se: float
    dof: int


def wls_fit(x: np.ndarray, y: np.ndarray, w: np.ndarray, intercept: bool = True) -> Fit:
    """Weighted least squares: minimise ``sum_i w_i (y_i - a x_i - b)^2``.

    With design ``X = [x, 1]`` (or ``[x]`` without intercept) and ``W = diag(w)``:
    ``beta = (X^T W X)^-1 X^T W y``; the weights are relative, so the covariance is
    ``s^2 (X^T W X)^-1`` with ``s^2 = sum_i w_i r_i^2 / (n - p)`` (residuals ``r``, ``p``
    parameters), the usual WLS estimate; standard errors are NaN when ``n == p``.
    Points with a non-finite value or ``w <= 0`` are dropped. Raises ValueError when fewer
    than ``p`` points remain.
    """
    x, y, w = (np.asarray(a, np.float64).ravel() for a in (x, y, w))
    if not (len(x) == len(y) == len(w)):
        raise ValueError(f"wls_fit: x, y, w lengths differ: {len(x)}, {len(y)}, {len(w)}")
    ok = np.isfinite(x) & np.isfinite(y) & np.isfinite(w) & (w > 0)
    x, y, w = x[ok], y[ok], w[ok]
    X = np.stack([x, np.ones_like(x)], 1) if intercept else x[:, None]
    n, p = X.shape
    if n < p:
        raise ValueError(f"wls_fit: {n} usable points for {p} parameters")
    xtwx_inv = np.linalg.inv(X.T @ (w[:, None] * X))
    beta = xtwx_inv @ (X.T @ (w * y))
    r = y - X @ beta
    se = np.sqrt(np.diag(xtwx_inv) * float(np.sum(w * r * r)) / (n - p)) if n > p else np.full(p, np.nan)
    return Fit(float(beta[0]), float(beta[1]) if intercept else 0.0, float(se[0]),
               float(se[1]) if intercept else float("nan"), n - p)


def fit_bins(bins: dict[str, np.ndarray], intercept: bool = True) -> Fit:
    """`wls_fit` of ``delta_sq_mean`` on ``entropy_mean`` over the non-empty bins of
    `bin_by_entropy`, weighted by token count (so each token counts once)."""
    return wls_fit(bins["entropy_mean"], bins["delta_sq_mean"], bins["count"], intercept)


def bootstrap_slope(delta: np.ndarray, entropy: np.ndarray, edges: Sequence[float],
                    n_boot: int = 200, seed: int = 0, intercept: bool = True) -> np.ndarray:
    """Slopes of `fit_bins` on ``n_boot`` resamples of the tokens (with replacement,
    ``numpy.random.default_rng(seed)``): ``[n_boot]`` float64; their std is a standard
    error that does not assume equal variance across bins. Resamples with too few
    non-empty bins give NaN."""
    delta, entropy = np.asarray(delta, np.float64), np.asarray(entropy, np.float64)
    rng = np.random.default_rng(seed)
    out = np.full(n_boot, np.nan)
    for b in range(n_boot):
        i = rng.integers(0, len(delta), len(delta))
        try:
            out[b] = fit_bins(bin_by_entropy(delta[i], entropy[i], edges), intercept).slope
        except (ValueError, np.linalg.LinAlgError):
            pass
    return out


def off_mode_outliers(tokens: Tokens, entropy_max: float = LOW_ENTROPY_NATS, abs_delta_min: float = 0.5,
                      logp_mu_max: float = math.log(0.5)) -> np.ndarray:
    """Low-entropy off-mode tokens (ESTR section 3.1/3.5): ``[N] bool``
    ``1[H < entropy_max] * (1[|delta| >= abs_delta_min] + 1[logp_mu <= logp_mu_max] > 0)``.

    Since ``H >= h(p_max)`` (binary entropy of the mode's mass), ``H < h(0.02) = 0.098``
    nats forces ``p_max > 0.98``: a sampled token with ``mu <= 0.5`` there is not the mode
    (its small ``mu`` amplifies any train/inference mismatch in ``delta``).
    """
    low = tokens.entropy_mu < entropy_max
    return low & ((np.abs(tokens.delta) >= abs_delta_min) | (tokens.logp_mu <= logp_mu_max))


def gate_params(config: dict[str, Any]) -> dict[str, dict[str, float]]:
    """The ENTR (``tau``, ``eps``), IcePop (``alpha``, ``beta``) and KPop (``phi``)
    settings recorded in a run's config (each method's section is always present)."""
    obj = config["objective"]
    return {"entr": {"tau": obj["entr"]["tau"], "eps": obj["entr"]["eps"]},
            "icepop": {"alpha": obj["icepop"]["alpha"], "beta": obj["icepop"]["beta"]},
            "kpop": {"phi": obj["kpop"]["phi"]}}


def gate_decisions(tokens: Tokens, params: dict[str, dict[str, float]]) -> dict[str, np.ndarray]:
    """Keep (True) / cut decisions ``[N] bool`` of the real gates of
    `entr_jax.objectives.gates` on the sampled tokens, with ``params`` as `gate_params`:
    ``entr``: ``|delta| <= sqrt(tau (H + eps))`` (`entr_mask`); ``icepop``:
    ``alpha <= exp(delta) <= beta`` (`icepop_mask`); ``kpop``:
    ``max(D(p||q), D(q||p)) <= phi``, ``p = pi(o_t)``, ``q = mu(o_t)`` (`kpop_mask`)."""
    import jax.numpy as jnp

    from entr_jax.objectives.gates import entr_mask, icepop_mask, kpop_mask

    f32 = lambda a: jnp.asarray(a, jnp.float32)  # noqa: E731  (the learner's dtype)
    d, e, p = params["entr"], params["icepop"], params["kpop"]
    return {
        "entr": np.asarray(entr_mask(f32(tokens.delta), f32(tokens.entropy_mu), d["tau"], d["eps"])),
        "icepop": np.asarray(icepop_mask(f32(tokens.delta), e["alpha"], e["beta"])),
        "kpop": np.asarray(kpop_mask(f32(tokens.logp_pi), f32(tokens.logp_mu), p["phi"])),
    }


def entr_band(entropy: np.ndarray, tau: float, eps: float) -> np.ndarray:
    """Half-width of ENTR's keep band in the (H, delta) plane: ``sqrt(tau (max(H, 0) + eps))``
    (keep iff ``|delta| <=`` it; ESTR section 3.2)."""
    return np.sqrt(tau * (np.maximum(np.asarray(entropy, np.float64), 0.0) + eps))


def icepop_band(alpha: float, beta: float) -> tuple[float, float]:
    """IcePop's keep band ``[log alpha, log beta]`` for delta, independent of H (Ring-1T)."""
    return math.log(alpha), math.log(beta)


def kpop_band(logp_mu: np.ndarray, phi: float, delta_grid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """KPop's keep band in the (logp_mu, delta) plane (it depends on mu(o_t), not on H):
    for each ``logp_mu[j]``, the smallest and largest ``delta`` of ``delta_grid`` that
    `kpop_mask` keeps with ``logp_pi = logp_mu + delta``; NaN where none is kept.
    Returns two ``[J]`` arrays."""
    import jax.numpy as jnp

    from entr_jax.objectives.gates import kpop_mask

    lmu = np.asarray(logp_mu, np.float64)[:, None]
    grid = np.asarray(delta_grid, np.float64)[None, :]
    keep = np.asarray(kpop_mask(jnp.asarray(lmu + grid, jnp.float32),
                                jnp.asarray(np.broadcast_to(lmu, (lmu.shape[0], grid.shape[1])), jnp.float32),
                                phi))
    lo = np.where(keep.any(1), np.min(np.where(keep, grid, np.inf), 1), np.nan)
    hi = np.where(keep.any(1), np.max(np.where(keep, grid, -np.inf), 1), np.nan)
    return lo, hi


def cut_fraction_by_bin(entropy: np.ndarray, keep: np.ndarray, edges: Sequence[float]) -> np.ndarray:
    """Fraction of tokens cut (``~keep``) per entropy bin (`bin_by_entropy` convention):
    ``[K]`` float64, NaN for empty bins."""
    idx = np.searchsorted(np.asarray(edges, np.float64), np.asarray(entropy, np.float64), side="right") - 1
    cut = ~np.asarray(keep, bool)
    return np.array([cut[idx == i].mean() if np.any(idx == i) else np.nan for i in range(len(edges))])


def metric_buckets(run: Run, steps: Iterable[int] | None = None) -> dict[str, np.ndarray]:
    """The learner's own ``ratio_by_entropy/b{i}/*`` metrics pooled over steps (all, or
    ``steps``): ``count`` (sum), ``entropy_mean`` and ``delta_sq_mean`` (count-weighted
    means; NaN for empty buckets), bucket edges `entr_jax.metrics.ENTROPY_BUCKET_EDGES`."""
    wanted = None if steps is None else set(steps)
    rows = [m for m in run.metrics if wanted is None or m["step"] in wanted]
    k = 0
    while rows and f"ratio_by_entropy/b{k}/count" in rows[0]:
        k += 1
    count = np.array([[m[f"ratio_by_entropy/b{i}/count"] for i in range(k)] for m in rows]).reshape(-1, k)
    out = {"count": count.sum(0).astype(np.int64)}
    for name in ("entropy_mean", "delta_sq_mean"):
        v = np.array([[m[f"ratio_by_entropy/b{i}/{name}"] for i in range(k)] for m in rows]).reshape(-1, k)
        with np.errstate(invalid="ignore", divide="ignore"):
            out[name] = np.where(out["count"] > 0, (v * count).sum(0) / out["count"], np.nan)
    return out
