"""Gradient accumulation is exact: loss and gradient-norm ratios to one microbatch.

For every registry objective and every aggregation mode, one optimizer batch (16 rows,
some of them padding, so that with 16 microbatches several microbatches hold no loss
token) is split into M = 1, 2, 4, 16 microbatches and run through
`learners.accumulate.accumulate` with a small shared-parameter policy (a bigram table,
``logp_pi(o_t) = log_softmax(W[o_{t-1}] / temperature)[o_t]``), so every microbatch's
gradient lands on the same parameters. Prints a markdown table of
``loss(M) / loss(1)`` and ``|grad(M)| / |grad(1)|``; all must be 1.

Usage: ``python -m benchmarks.accumulation`` (CPU, a few minutes: one compile per objective).
The same cases are asserted by ``tests/test_accumulation.py``.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from entr_jax import objectives as obj
from entr_jax.types import Batch
from learners.accumulate import accumulate

ROWS, T, V = 16, 7, 11
MICROBATCHES = (1, 2, 4, 16)
NAMES = tuple(n for n in obj.OBJECTIVES if n != "estr")
L_NORM = 8.0


def overrides(name: str, aggregation: str) -> dict:
    """Config of one table cell: the aggregation, Dr.GRPO's constant, GRPO's KL term, and
    the proximal (decoupled) mode for IcePop so both ratio modes are covered."""
    kw: dict = {"aggregation": aggregation, "l_norm": L_NORM}
    if name == "entr" and aggregation == "token_mean_kept":
        kw = {"denominator": "kept_tokens", "aggregation": "token_mean", "l_norm": L_NORM}
    if name == "grpo":
        kw["kl_coef"] = 0.1
    if name == "icepop":
        kw["ratio_mode"] = "decoupled"
    if name == "trm":
        kw["threshold"] = 0.5  # keeps some rows and rejects others on this batch
    return kw


def bigram_logp(params: jax.Array, mb: Batch) -> tuple[jax.Array, jax.Array]:
    """``(logp [b, T], entropy [b, T])`` of the bigram policy ``W = params [V, V]``."""
    logits = params[mb.tokens[:, :-1]]
    logz = jax.nn.log_softmax(logits, axis=-1)
    logp = jnp.take_along_axis(logz, mb.tokens[:, 1:, None], axis=-1)[..., 0]
    entropy = -jnp.sum(jnp.exp(logz) * logz, axis=-1)
    return logp, entropy


def make_case(seed: int = 0) -> tuple[jax.Array, Batch]:
    """Parameters and a ``[1, ROWS, ...]`` batch: rows 0-10 hold 1-6 loss tokens each, rows
    11-15 are padding (no loss token); behaviour log-probs are the policy's plus noise of
    scale 0.4 (so every gate keeps some tokens and rejects others)."""
    rng = np.random.default_rng(seed)
    params = jnp.asarray(rng.normal(size=(V, V)), jnp.float32)
    tokens = rng.integers(0, V, (ROWS, T + 1)).astype(np.int32)
    loss_mask = np.zeros((ROWS, T), bool)
    for i in range(11):
        start = int(rng.integers(0, 3))
        loss_mask[i, start:start + int(rng.integers(1, 7))] = True
    logp, _ = bigram_logp(params, Batch(tokens=jnp.asarray(tokens), attention_mask=None, loss_mask=None,
                                        advantages=None, logp_mu=None, entropy_mu=None, token_version=None))
    logp = np.asarray(logp)
    noise = lambda s: (s * rng.normal(size=(ROWS, T))).astype(np.float32)  # noqa: E731
    adv_rows = rng.normal(size=(ROWS, 1)).astype(np.float32)
    batch = Batch(
        tokens=tokens,
        attention_mask=np.ones((ROWS, T + 1), bool),
        loss_mask=loss_mask,
        advantages=np.where(loss_mask, adv_rows, 0.0).astype(np.float32),
        logp_mu=np.where(loss_mask, logp + noise(0.4), 0.0).astype(np.float32),
        entropy_mu=np.abs(noise(1.0)),
        token_version=np.zeros((ROWS, T), np.int32),
        logp_prox=(logp + noise(0.3)).astype(np.float32),
        logp_ref=(logp + noise(0.3)).astype(np.float32),
        entropy_mu_valid=np.ones((ROWS, T), bool),
    )
    return params, jax.tree.map(lambda x: jnp.asarray(x)[None], batch)


def split(batch: Batch, m: int) -> Batch:
    """``[1, ROWS, ...] -> [m, ROWS / m, ...]`` (row r goes to microbatch r // (ROWS / m))."""
    return jax.tree.map(lambda x: x.reshape((m, ROWS // m) + x.shape[2:]), batch)


def run_objective(name: str, case=None, aggregations=obj.AGGREGATIONS,
                  microbatches=MICROBATCHES) -> dict:
    """``{(aggregation, M): (loss, gradient [V, V], metrics)}`` of one objective, all cells
    in one compiled function (one compile per objective)."""
    params, batch = make_case() if case is None else case
    objectives = {agg: obj.make_objective(name, **overrides(name, agg)) for agg in aggregations}

    @jax.jit
    def run(params, batch):
        out = {}
        for agg, f in objectives.items():
            for m in microbatches:
                acc = accumulate(f, bigram_logp, params, split(batch, m), batch_stats=f.batch_stats)
                out[(agg, m)] = (acc.loss, acc.grads, acc.metrics)
        return out

    host = jax.device_get(run(params, batch))
    return {key: (float(loss), np.asarray(g), {k: float(v) for k, v in met.items()})
            for key, (loss, g, met) in host.items()}


@dataclasses.dataclass
class Row:
    name: str
    aggregation: str
    loss_ratio: dict
    grad_norm_ratio: dict
    max_grad_diff: float
    max_metric_diff: float


def table(names=NAMES, aggregations=obj.AGGREGATIONS, microbatches=MICROBATCHES) -> list[Row]:
    """Every cell: ratios to ``M = 1`` and the largest absolute gradient / metric gap."""
    case = make_case()
    rows = []
    for name in names:
        cells = run_objective(name, case, aggregations, microbatches)
        for aggregation in aggregations:
            loss1, g1, m1 = cells[(aggregation, 1)]
            lr, gr, gd, md = {}, {}, 0.0, 0.0
            for m in microbatches:
                loss, g, met = cells[(aggregation, m)]
                lr[m] = loss / loss1
                gr[m] = float(np.linalg.norm(g) / np.linalg.norm(g1))
                gd = max(gd, float(np.max(np.abs(g - g1))))
                md = max(md, max(abs(met[k] - m1[k]) / max(1.0, abs(m1[k])) for k in m1))
            rows.append(Row(name, aggregation, lr, gr, gd, md))
    return rows


def markdown(rows: list[Row], microbatches=MICROBATCHES) -> str:
    head = ["objective", "aggregation"] + [f"loss M={m}" for m in microbatches[1:]] + [
        f"|grad| M={m}" for m in microbatches[1:]] + ["max abs grad diff"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r.name, r.aggregation] + [f"{r.loss_ratio[m]:.4f}" for m in microbatches[1:]] + [
            f"{r.grad_norm_ratio[m]:.4f}" for m in microbatches[1:]] + [f"{r.max_grad_diff:.1e}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown(table()))
