"""The jitted, sharded learner steps: RL (objective from the registry), SFT, and log-probs.

One call of the train step consumes one *rollout batch* (``docs/design.md``,
"Jit and sharding"; the PPO loop of verl / AReaL / tunix):

1. the rollout batch arrives microbatched, ``[P * M, b, ...]`` rows sharded over
   ``("data", "fsdp")`` (`learners.batching.make_batch` with ``num_minibatches = P`` and
   ``num_microbatches = M``, which gives every mini-batch its share of real rows);
   ``logp_prox`` / ``logp_ref``, when the objective reads them, were computed once for the
   whole rollout batch before the call (`make_logprob_fn`, `learners.learner`);
2. it is split into ``P = num_minibatches`` mini-batches of consecutive rows (mini-batch
   ``j`` holds microbatches ``[j M, (j+1) M)``), each an *optimizer batch* of ``M``
   microbatches; the mini-batches are visited in order, ``num_epochs`` times (the same
   order every epoch; no reshuffling), so ``K = P * num_epochs`` optimizer updates;
3. each optimizer update accumulates the loss and gradient of its ``M`` microbatches
   exactly (`learners.accumulate`: normalisers and the objective's batch statistics are
   those of the whole mini-batch), then, if the loss and gradient are finite and the
   mini-batch has loss tokens, applies the optax chain (`learners.optim.make_optimizer`);
   otherwise the update is skipped inside jit (parameters and optimizer state
   unchanged);
4. ``version`` (the policy version samplers see) advances by one per call in which at
   least one update was applied: it counts rollout batches consumed, i.e. weight
   publications, so ``staleness = version - token_version`` is measured in rollout
   batches, like the staleness queue's lags. The optimizer's own update count (optax's
   ``count``) drives the learning-rate schedule; ``step`` counts calls.

Metrics of one optimizer update: the objective's metrics over the whole mini-batch,
``loss``, ``train/grad_norm`` (global L2 norm of the accumulated gradient, before
clipping), ``train/update_norm`` (0 when skipped), ``train/param_norm`` (after),
``train/learning_rate`` (of this update, from the optimizer's update count),
``train/applied``, ``train/skipped`` (non-finite loss or gradient), ``train/empty`` (no
loss tokens), ``train/nonfinite_loss``, ``train/nonfinite_grad`` (0/1 each), and the token
diagnostics of `learners.diagnostics` (staleness against the version before the call).
The call returns them stacked over its K updates and reduced to one record by
`learners.diagnostics.reduce_over_steps` (each metric pooled by its declared rule, the
token diagnostics finalized once from the sums of all K updates, so the record is the
value over every token the call trained on), plus ``train/version`` (after the call),
``train/optimizer_steps`` (K) and ``train/grad_norm_max`` (the largest of the K updates'
gradient norms; ``train/grad_norm`` is their mean, which would hide a spike in one
update).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Literal

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh

from entr_jax.logprobs import CHUNK_SIZE, token_logprobs_entropy
from entr_jax.sharding import batch_sharding, replicated
from entr_jax.types import BATCH_ROW_FIELDS, Batch, ObjectiveInput
from learners.accumulate import accumulate
from entr_jax.objectives.pooling import METRIC_POOLING
from learners.diagnostics import HISTOGRAM_EDGES, finalize, reduce_over_steps, token_sums
from learners.state import TrainState

__all__ = ["HISTOGRAM_EDGES", "Step", "make_logprob_fn", "make_train_step"]

Objective = Callable[[jax.Array, Any], tuple[jax.Array, dict[str, jax.Array]]]


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


def _sft_loss(logp_pi: jax.Array, batch: ObjectiveInput) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Token cross-entropy ``-sum_{t in loss_mask} logp_pi[t] / num_loss_tokens`` (the
    optimizer batch's loss tokens, floored at 1); metric ``loss/normaliser``: that count,
    the weight that pools ``loss`` over updates."""
    nll = -jnp.sum(jnp.where(batch.loss_mask, logp_pi, 0.0)) / jnp.maximum(batch.num_loss_tokens, 1.0)
    return nll, {"loss/normaliser": jnp.asarray(batch.num_loss_tokens, jnp.float32)}


def _constrain_batch(mb: Batch, mesh: Mesh) -> Batch:
    """Pin every ``[b, ...]`` field of a microbatch to the batch sharding."""
    def pin(x):
        if x is None:
            return None
        return jax.lax.with_sharding_constraint(x, batch_sharding(mesh, x.ndim, 0))

    return mb.replace(**{name: pin(getattr(mb, name)) for name in BATCH_ROW_FIELDS})


def _update_count(opt_state: Any) -> jax.Array:
    """The optimizer's number of applied updates (optax's ``count``)."""
    found = optax.tree_utils.tree_get_all_with_path(opt_state, "count")
    if not found:
        raise ValueError("make_train_step: lr_schedule given but the optimizer state has no "
                         "update count (optax 'count'); build it with learners.optim.make_optimizer")
    return found[0][1]


def make_train_step(
    kind: Literal["rl", "sft"],
    tx: optax.GradientTransformation,
    state_shardings: TrainState,
    mesh: Mesh,
    *,
    objective: Objective | None = None,
    chunk_size: int = CHUNK_SIZE,
    temperature: float = 1.0,
    top_k: int = -1,
    top_p: float = 1.0,
    min_p: float = 0.0,
    lr_schedule: optax.Schedule | None = None,
    num_minibatches: int = 1,
    num_epochs: int = 1,
) -> Step:
    """Compile ``step(state, batch) -> (state, metrics, step_metrics)`` for RL or SFT.

    Args:
      kind: ``"rl"``: ``loss, metrics = objective(logp_pi, inputs)`` per microbatch, where
        ``inputs`` (`entr_jax.types.ObjectiveInput`, `learners.accumulate.view`) holds the
        per-token fields of one microbatch, the optimizer batch's normalisers
        (``num_loss_tokens``, ``num_sequences``) and statistics (``batch_stats``), and
        ``entropy_pi`` (detached entropy of pi, for ``entropy_source="current_full"``). ``"sft"``: token cross-entropy on loss tokens,
        ``-sum logp_pi / num_loss_tokens``.
      tx: the optax transformation (`learners.optim.make_optimizer`).
      state_shardings: `learners.state.train_state_shardings` of the state (built once).
      mesh: the learner mesh.
      objective: an `entr_jax.objectives.Objective`, required for ``"rl"`` (closed over,
        static), e.g. ``make_objective("entr")``; its ``batch_stats`` (None for most)
        gives the statistics taken over the whole optimizer batch, and its
        ``metric_pooling`` (``{key: rule}``, see `entr_jax.objectives.pooling`) the
        pooling rules of metrics that `entr_jax.objectives.METRIC_POOLING` does not
        declare (a custom objective's).
      chunk_size, temperature: passed to `token_logprobs_entropy`; ``temperature`` must be
        the sampling temperature so ``logp_pi`` and ``logp_mu`` describe the same
        distribution family.
      top_k, top_p, min_p: the sampler's filters, passed to `token_logprobs_entropy` for
        ``"rl"`` (so ``logp_pi`` scores the filtered distribution ``logp_mu`` was drawn
        from); ``"sft"`` ignores them (demonstrations are scored unfiltered).
      lr_schedule: reported as ``train/learning_rate`` at the optimizer's update count.
      num_minibatches: optimizer updates per pass over the rollout batch (>= 1); the
        batch's leading (microbatch) axis must be divisible by it.
      num_epochs: passes over the rollout batch (>= 1).

    Returns:
      a `Step` whose function takes the state (donated) and a microbatched `Batch` placed
      with `learners.distributed.shard_batch`, and returns the new state (same shardings),
      the rollout batch's metrics (see the module docstring; replicated device arrays,
      fetch them a step later) and the per-update metrics stacked on a leading ``[K]``
      axis.

    Raises:
      ValueError: bad ``kind``, missing objective, ``num_minibatches``/``num_epochs`` < 1,
        or (at trace time) a leading axis not divisible by ``num_minibatches`` or a
        metric without a pooling rule (`learners.diagnostics.reduce_over_steps`).
    """
    if kind not in ("rl", "sft"):
        raise ValueError(f"make_train_step: kind must be 'rl' or 'sft', got {kind!r}")
    if kind == "rl" and objective is None:
        raise ValueError("make_train_step: kind='rl' needs an objective")
    for name, value in (("num_minibatches", num_minibatches), ("num_epochs", num_epochs)):
        if value < 1:
            raise ValueError(f"make_train_step: {name} must be >= 1, got {value}")
    loss_fn = objective if kind == "rl" else _sft_loss
    filters = dict(top_k=top_k, top_p=top_p, min_p=min_p) if kind == "rl" else {}
    stats_fn = objective.batch_stats if kind == "rl" else None
    rules = {**METRIC_POOLING, **((objective.metric_pooling if kind == "rl" else None) or {})}
    graphdef = state_shardings.graphdef
    param_shardings = state_shardings.params
    step = Step(fn=lambda *a: None)

    def train_step(state: TrainState, batch: Batch):
        step.traces[0] += 1
        total = batch.tokens.shape[0]
        if total % num_minibatches:
            raise ValueError(
                f"make_train_step: the batch's {total} microbatches do not split into "
                f"num_minibatches={num_minibatches} (build it with num_microbatches = "
                "num_minibatches * microbatches per optimizer step)")
        per = total // num_minibatches
        minis = jax.tree.map(lambda x: x.reshape((num_minibatches, per) + x.shape[1:]),
                             batch.replace(num_loss_tokens=None))

        def logp_fn(params, mb):
            model = nnx.merge(graphdef, params, state.other)
            return token_logprobs_entropy(model, mb.tokens, mb.attention_mask,
                                          chunk_size=chunk_size, temperature=temperature,
                                          **filters)

        def update(carry, mini):
            params, opt_state, applied = carry
            acc = accumulate(
                loss_fn, logp_fn, params, mini, batch_stats=stats_fn,
                constrain=lambda mb: _constrain_batch(mb, mesh),
                constrain_grads=lambda g: jax.lax.with_sharding_constraint(g, param_shardings),
            )
            grad_norm = optax.global_norm(acc.grads)
            loss_finite, grad_finite = jnp.isfinite(acc.loss), jnp.isfinite(grad_norm)
            finite = loss_finite & grad_finite
            nonempty = jnp.any(mini.loss_mask)
            ok = finite & nonempty
            grads = jax.tree.map(lambda g, p: g.astype(p.dtype), acc.grads, params)
            updates, new_opt_state = tx.update(grads, opt_state, params)
            new_params = optax.apply_updates(params, updates)
            keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(ok, a, b), new, old)  # noqa: E731
            new_params = keep(new_params, params)
            f32 = lambda x: x.astype(jnp.float32)  # noqa: E731
            sums = token_sums(acc.logp, acc.entropy, mini, state.version)
            metrics = {
                **acc.metrics,
                "loss": acc.loss,
                "train/grad_norm": grad_norm,
                "train/update_norm": jnp.where(ok, optax.global_norm(updates), 0.0),
                "train/param_norm": optax.global_norm(new_params),
                "train/applied": f32(ok),
                "train/skipped": f32(~finite),
                "train/empty": f32(finite & ~nonempty),
                "train/nonfinite_loss": f32(~loss_finite),
                "train/nonfinite_grad": f32(~grad_finite),
                **finalize(*sums),
            }
            if lr_schedule is not None:
                metrics["train/learning_rate"] = jnp.asarray(
                    lr_schedule(_update_count(opt_state)), jnp.float32)
            carry = (new_params, keep(new_opt_state, opt_state), applied + ok.astype(jnp.int32))
            return carry, (metrics, sums)

        def epoch(carry, _):
            return jax.lax.scan(update, carry, minis)

        init = (state.params, state.opt_state, jnp.zeros((), jnp.int32))
        k = num_epochs * num_minibatches
        if k == 1:  # one update: no loop to compile
            (params, opt_state, applied), one = update(init, jax.tree.map(lambda x: x[0], minis))
            stacked, sums = jax.tree.map(lambda x: x[None], one)
        else:
            (params, opt_state, applied), (stacked, sums) = jax.lax.scan(
                epoch, init, None, length=num_epochs)
            stacked, sums = jax.tree.map(lambda x: x.reshape((k,) + x.shape[2:]), (stacked, sums))
        stacked = jax.tree.map(lambda x: x.astype(jnp.float32), stacked)
        version = state.version + (applied > 0).astype(jnp.int32)
        metrics = reduce_over_steps(stacked, num_epochs, diagnostic_sums=sums, rules=rules)
        metrics["train/version"] = version.astype(jnp.float32)
        metrics["train/optimizer_steps"] = jnp.float32(k)
        metrics["train/grad_norm_max"] = jnp.max(stacked["train/grad_norm"])
        new_state = state.replace(
            params=params, opt_state=opt_state, version=version, step=state.step + 1
        )
        return new_state, metrics, stacked

    step.fn = jax.jit(
        train_step,
        in_shardings=(state_shardings, None),
        out_shardings=(state_shardings, replicated(mesh), replicated(mesh)),
        donate_argnums=(0,),
    )
    return step


def make_logprob_fn(
    state_shardings: TrainState,
    mesh: Mesh,
    *,
    chunk_size: int = CHUNK_SIZE,
    temperature: float = 1.0,
    top_k: int = -1,
    top_p: float = 1.0,
    min_p: float = 0.0,
) -> Step:
    """Compile ``fn(params, other, batch) -> (logp [M, b, T] f32, entropy [M, b, T] f32)``.

    ``chunk_size``, ``temperature`` and the sampler's filters ``top_k``, ``top_p``,
    ``min_p`` go to `token_logprobs_entropy` (the same distribution the RL step scores).

    No gradient. Used for ``logp_prox`` (called once per rollout batch with
    ``state.params`` before its first optimizer update: the proximal policy of decoupled
    PPO / AReaL, algorithms.md section 4.4) and ``logp_ref`` (called with the frozen
    reference parameters, which must have the same structure and shardings as
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
