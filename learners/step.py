"""The jitted, sharded learner steps: RL (objective from the registry), SFT, and log-probs.

One optimizer step (``docs/design.md``, "Jit and sharding"):

1. the batch arrives microbatched, ``[M, b, ...]`` (`learners.batching.make_batch`), rows
   sharded over ``("data", "fsdp")``; ``num_loss_tokens`` is the host-computed number of
   loss tokens of the *whole* batch;
2. ``lax.scan`` over the M microbatches computes ``logp_pi`` with
   `entr_jax.logprobs.token_logprobs_entropy`, the loss (each microbatch's loss is
   ``sum over its tokens / num_loss_tokens``, so losses and gradients add up to the
   full-batch ones) and sums the gradients;
3. if the summed loss or any gradient is non-finite the update is skipped inside jit
   (parameters, optimizer state and ``version`` unchanged) and ``train/skipped = 1``;
4. otherwise the optax chain (`learners.optim.make_optimizer`) is applied and ``version``
   advances by one.

Metrics (flat dict of f32 scalars, plus ``hist/*`` bucket counts): the objective's own
metrics (averaged over microbatches; keys ending in ``/max`` take the maximum and ``/min``
the minimum), ``loss``, ``train/grad_norm`` (global L2 norm of the summed gradient, before
clipping), ``train/update_norm`` (L2 norm of the applied update, 0 when skipped),
``train/param_norm`` (after the step), ``train/learning_rate``, ``train/skipped``,
``train/nonfinite_loss``, ``train/nonfinite_grad``, ``train/version`` (after the step),
``tokens/num_loss_tokens`` (counted on device from ``loss_mask``), ``entropy_pi/mean`` (mean
full-vocabulary entropy of pi over loss tokens, nats), ``log_ratio_pi_mu/mean`` and
``log_ratio_pi_mu/abs_max`` (``logp_pi - logp_mu`` on loss tokens), ``entropy_mu/mean``,
``kl_mu_pi/k3`` (the k3 estimate of KL(mu || pi), `entr_jax.metrics.k3_sum`),
``ratio_by_entropy/b{i}/{count,delta_sq_mean,entropy_mean}`` (E[delta^2] per behavior
entropy bucket, `entr_jax.metrics.ratio_by_entropy_bucket_sums`), ``staleness/mean`` and
``staleness/max`` (``version - token_version`` on loss tokens, with the version *before*
the step, i.e. the one the gradient is taken at), and histograms ``hist/log_ratio_pi_mu``
and ``hist/entropy_pi`` with edges `HISTOGRAM_EDGES` (values outside are clamped into the
end buckets).
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any, Callable, Literal

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh

from entr_jax import metrics as diag
from entr_jax.logprobs import token_logprobs_entropy
from entr_jax.sharding import batch_sharding, replicated
from entr_jax.types import Batch
from learners.state import TrainState

__all__ = ["HISTOGRAM_EDGES", "Step", "make_logprob_fn", "make_train_step"]

Objective = Callable[[jax.Array, Any], tuple[jax.Array, dict[str, jax.Array]]]

HISTOGRAM_EDGES: dict[str, np.ndarray] = {
    "hist/log_ratio_pi_mu": np.linspace(-2.0, 2.0, 41, dtype=np.float32),
    "hist/entropy_pi": np.linspace(0.0, 12.0, 49, dtype=np.float32),
}

_BATCH_FIELDS = (
    "tokens", "attention_mask", "loss_mask", "advantages", "logp_mu", "entropy_mu",
    "token_version", "logp_prox", "logp_ref",
)


@dataclasses.dataclass
class Step:
    """A compiled step plus a Python-side trace counter (incremented once per trace).

    Call it like the function it wraps. ``traces`` staying at 1 across calls means the
    step was not retraced.
    """

    fn: Callable[..., Any]
    traces: list[int] = dataclasses.field(default_factory=lambda: [0])

    def __call__(self, *args):
        return self.fn(*args)

    @property
    def num_traces(self) -> int:
        return self.traces[0]


def _masked_hist(x: jax.Array, mask: jax.Array, edges: np.ndarray) -> jax.Array:
    clipped = jnp.clip(x, edges[0], edges[-1])
    counts, _ = jnp.histogram(clipped, bins=jnp.asarray(edges), weights=mask.astype(jnp.float32))
    return counts.astype(jnp.float32)


def _token_sums(logp, entropy, mb, version) -> tuple[dict, dict]:
    """Sums and maxima over this microbatch's loss tokens (combined across microbatches)."""
    mask = mb.loss_mask
    f32 = jnp.float32
    log_ratio = jnp.where(mask, logp - mb.logp_mu, 0.0)
    ent = jnp.where(mask, entropy, 0.0)
    staleness = jnp.where(mask, (version - mb.token_version).astype(f32), 0.0)
    sums = {
        "tokens/num_loss_tokens": jnp.sum(mask.astype(f32)),
        "entropy_pi/sum": jnp.sum(ent),
        "entropy_mu/sum": jnp.sum(jnp.where(mask, mb.entropy_mu, 0.0)),
        "kl_mu_pi/k3_sum": diag.k3_sum(log_ratio, mask),
        **diag.ratio_by_entropy_bucket_sums(log_ratio, mb.entropy_mu, mask),
        "log_ratio_pi_mu/sum": jnp.sum(log_ratio),
        "staleness/sum": jnp.sum(staleness),
        "hist/log_ratio_pi_mu": _masked_hist(
            log_ratio, mask, HISTOGRAM_EDGES["hist/log_ratio_pi_mu"]
        ),
        "hist/entropy_pi": _masked_hist(ent, mask, HISTOGRAM_EDGES["hist/entropy_pi"]),
    }
    maxes = {
        "log_ratio_pi_mu/abs_max": jnp.max(jnp.abs(log_ratio)),
        "staleness/max": jnp.max(jnp.where(mask, staleness, -jnp.inf)),
    }
    return sums, maxes


def _reduce_objective_metrics(stacked: dict[str, jax.Array]) -> dict[str, jax.Array]:
    out = {}
    for key, value in stacked.items():
        value = value.astype(jnp.float32)
        if key.endswith("/max"):
            out[key] = jnp.max(value, axis=0)
        elif key.endswith("/min"):
            out[key] = jnp.min(value, axis=0)
        else:
            out[key] = jnp.mean(value, axis=0)
    return out


def _sft_loss(logp_pi: jax.Array, batch: Any) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Token cross-entropy ``-sum_{t in loss_mask} logp_pi[t] / num_loss_tokens``."""
    nll = -jnp.sum(jnp.where(batch.loss_mask, logp_pi, 0.0)) / batch.num_loss_tokens
    return nll, {}


def _constrain_batch(mb: Batch, mesh: Mesh) -> Batch:
    """Pin every ``[b, ...]`` field of a microbatch to the batch sharding."""
    def pin(x):
        if x is None:
            return None
        return jax.lax.with_sharding_constraint(x, batch_sharding(mesh, x.ndim, 0))

    return mb.replace(**{name: pin(getattr(mb, name)) for name in _BATCH_FIELDS})


def make_train_step(
    kind: Literal["rl", "sft"],
    tx: optax.GradientTransformation,
    state_shardings: TrainState,
    mesh: Mesh,
    *,
    objective: Objective | None = None,
    chunk_size: int = 128,
    temperature: float = 1.0,
    top_k: int = -1,
    top_p: float = 1.0,
    min_p: float = 0.0,
    lr_schedule: optax.Schedule | None = None,
) -> Step:
    """Compile ``step(state, batch) -> (state, metrics)`` for RL or SFT.

    Args:
      kind: ``"rl"``: ``loss, metrics = objective(logp_pi, batch_view)`` where
        ``batch_view`` exposes the `Batch` fields of one microbatch (with the global
        ``num_loss_tokens``) plus ``entropy_pi`` (detached entropy of pi, for
        ``entropy_source="current_full"``). ``"sft"``: token cross-entropy on loss tokens,
        ``-sum logp_pi / num_loss_tokens``.
      tx: the optax transformation (`learners.optim.make_optimizer`).
      state_shardings: `learners.state.train_state_shardings` of the state (built once).
      mesh: the learner mesh.
      objective: required for ``"rl"`` (closed over, static), e.g.
        ``entr_jax.objectives.make_objective("entr")``.
      chunk_size, temperature: passed to `token_logprobs_entropy`; ``temperature`` must be
        the sampling temperature so ``logp_pi`` and ``logp_mu`` describe the same
        distribution family.
      top_k, top_p, min_p: the sampler's filters, passed to `token_logprobs_entropy` for
        ``"rl"`` (so ``logp_pi`` scores the filtered distribution ``logp_mu`` was drawn
        from); ``"sft"`` ignores them (demonstrations are scored unfiltered).
      lr_schedule: reported as ``train/learning_rate`` at the number of applied updates.

    Returns:
      a `Step` whose function takes the state (donated) and a microbatched `Batch` placed
      with `learners.distributed.shard_batch`, and returns the new state (same shardings)
      and the metrics dict (replicated device arrays; fetch them a step later).
    """
    if kind not in ("rl", "sft"):
        raise ValueError(f"make_train_step: kind must be 'rl' or 'sft', got {kind!r}")
    if kind == "rl" and objective is None:
        raise ValueError("make_train_step: kind='rl' needs an objective")
    loss_fn = objective if kind == "rl" else _sft_loss
    filters = dict(top_k=top_k, top_p=top_p, min_p=min_p) if kind == "rl" else {}
    graphdef = state_shardings.graphdef
    param_shardings = state_shardings.params
    step = Step(fn=lambda *a: None)

    def micro_loss(params, other, mb: Batch, num_loss_tokens):
        model = nnx.merge(graphdef, params, other)
        logp, entropy = token_logprobs_entropy(
            model, mb.tokens, mb.attention_mask, chunk_size=chunk_size, temperature=temperature,
            **filters,
        )
        view = types.SimpleNamespace(
            **{name: getattr(mb, name) for name in _BATCH_FIELDS},
            num_loss_tokens=num_loss_tokens,
            entropy_pi=entropy,
        )
        loss, metrics = loss_fn(logp, view)
        return loss, (metrics, logp, entropy)

    grad_fn = jax.value_and_grad(micro_loss, has_aux=True)

    def train_step(state: TrainState, batch: Batch):
        step.traces[0] += 1
        num_loss_tokens = jnp.asarray(batch.num_loss_tokens, jnp.float32)
        micro = batch.replace(num_loss_tokens=None)
        zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), state.params)
        zeros = jax.lax.with_sharding_constraint(zeros, param_shardings)

        def body(carry, mb):
            grad_sum, loss_sum, sums, maxes = carry
            mb = _constrain_batch(mb, mesh)
            (loss, (metrics, logp, entropy)), grads = grad_fn(
                state.params, state.other, mb, num_loss_tokens
            )
            grad_sum = jax.tree.map(lambda a, g: a + g.astype(jnp.float32), grad_sum, grads)
            grad_sum = jax.lax.with_sharding_constraint(grad_sum, param_shardings)
            s, m = _token_sums(jax.lax.stop_gradient(logp), entropy, mb, state.version)
            sums = jax.tree.map(jnp.add, sums, s)
            maxes = jax.tree.map(jnp.maximum, maxes, m)
            return (grad_sum, loss_sum + loss, sums, maxes), metrics

        first = jax.tree.map(lambda x: x[0], micro)
        init_sums, init_maxes = jax.eval_shape(
            lambda: _token_sums(
                jnp.zeros(first.logp_mu.shape), jnp.zeros(first.logp_mu.shape), first, state.version
            )
        )
        init = (
            zeros,
            jnp.zeros((), jnp.float32),
            jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), init_sums),
            jax.tree.map(lambda s: jnp.full(s.shape, -jnp.inf, s.dtype), init_maxes),
        )
        (grads, loss, sums, maxes), stacked = jax.lax.scan(body, init, micro)

        grad_norm = optax.global_norm(grads)
        loss_finite = jnp.isfinite(loss)
        grad_finite = jnp.isfinite(grad_norm)
        ok = loss_finite & grad_finite
        grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, state.params)
        updates, new_opt_state = tx.update(grads, state.opt_state, state.params)
        new_params = optax.apply_updates(state.params, updates)
        keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(ok, a, b), new, old)
        params = keep(new_params, state.params)
        opt_state = keep(new_opt_state, state.opt_state)
        version = state.version + ok.astype(jnp.int32)

        n_tok = jnp.maximum(sums["tokens/num_loss_tokens"], 1.0)
        metrics = _reduce_objective_metrics(stacked)
        metrics.update(
            {
                "loss": loss,
                "train/grad_norm": grad_norm,
                "train/update_norm": jnp.where(ok, optax.global_norm(updates), 0.0),
                "train/param_norm": optax.global_norm(params),
                "train/skipped": 1.0 - ok.astype(jnp.float32),
                "train/nonfinite_loss": 1.0 - loss_finite.astype(jnp.float32),
                "train/nonfinite_grad": 1.0 - grad_finite.astype(jnp.float32),
                "train/version": version.astype(jnp.float32),
                "tokens/num_loss_tokens": sums["tokens/num_loss_tokens"],
                "entropy_pi/mean": sums["entropy_pi/sum"] / n_tok,
                "entropy_mu/mean": sums["entropy_mu/sum"] / n_tok,
                "kl_mu_pi/k3": sums["kl_mu_pi/k3_sum"] / n_tok,
                **diag.bucket_means(sums),
                "log_ratio_pi_mu/mean": sums["log_ratio_pi_mu/sum"] / n_tok,
                "log_ratio_pi_mu/abs_max": jnp.maximum(maxes["log_ratio_pi_mu/abs_max"], 0.0),
                "staleness/mean": sums["staleness/sum"] / n_tok,
                "staleness/max": jnp.maximum(maxes["staleness/max"], 0.0),
                "hist/log_ratio_pi_mu": sums["hist/log_ratio_pi_mu"],
                "hist/entropy_pi": sums["hist/entropy_pi"],
            }
        )
        if lr_schedule is not None:
            metrics["train/learning_rate"] = jnp.asarray(
                lr_schedule(state.version), jnp.float32
            )
        new_state = state.replace(
            params=params, opt_state=opt_state, version=version, step=state.step + 1
        )
        return new_state, metrics

    step.fn = jax.jit(
        train_step,
        in_shardings=(state_shardings, None),
        out_shardings=(state_shardings, replicated(mesh)),
        donate_argnums=(0,),
    )
    return step


def make_logprob_fn(
    state_shardings: TrainState,
    mesh: Mesh,
    *,
    chunk_size: int = 128,
    temperature: float = 1.0,
    top_k: int = -1,
    top_p: float = 1.0,
    min_p: float = 0.0,
) -> Step:
    """Compile ``fn(params, other, batch) -> (logp [M, b, T] f32, entropy [M, b, T] f32)``.

    ``chunk_size``, ``temperature`` and the sampler's filters ``top_k``, ``top_p``,
    ``min_p`` go to `token_logprobs_entropy` (the same distribution the RL step scores).

    No gradient. Used for ``logp_prox`` (call it with the current ``state.params`` before
    the update, decoupled PPO / AReaL, algorithms.md section 4.4) and ``logp_ref`` (call it
    with the reference parameters, which must have the same structure and shardings as
    ``state.params``). The outputs are target-aligned like every ``[B, T]`` array and
    sharded like the batch rows; write them into the batch with
    ``batch.replace(logp_prox=logp)``.
    """
    graphdef = state_shardings.graphdef
    out = batch_sharding(mesh, 3, row_axis=1)
    step = Step(fn=lambda *a: None)

    def logprobs(params, other, batch: Batch):
        step.traces[0] += 1
        model = nnx.merge(graphdef, params, other)

        def body(_, mb):
            mb = _constrain_batch(mb, mesh)
            logp, entropy = token_logprobs_entropy(
                model, mb.tokens, mb.attention_mask, chunk_size=chunk_size,
                temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
            )
            return None, (logp, entropy)

        _, (logp, entropy) = jax.lax.scan(body, None, batch.replace(num_loss_tokens=None))
        return jax.lax.stop_gradient(logp), jax.lax.stop_gradient(entropy)

    step.fn = jax.jit(
        logprobs,
        in_shardings=(state_shardings.params, state_shardings.other, None),
        out_shardings=(out, out),
    )
    return step
