"""The learner: state + compiled steps + checkpoints + logging behind a small host API.

`Learner.train_on(trajectories, advantages)` consumes one rollout batch: it builds the
batch on the host (`learners.batching`), places it on the mesh
(`learners.distributed.shard_batch`), fills ``logp_prox`` (the current weights, i.e. the
policy before this rollout batch's first update) and ``logp_ref`` (the frozen reference
set with `Learner.set_reference`) once, when the objective reads them
(``objective.inputs``, `learners.step.make_logprob_fn`), dispatches the jitted step
(``minibatches x epochs`` optimizer updates, `learners.step.make_train_step`),
then fetches and logs the *previous* call's metrics (`learners.logging.DeferredMetrics`)
and feeds them to `NonFiniteGuard`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from entr_jax.objectives import Objective
from entr_jax.sharding import make_mesh
from entr_jax.types import Trajectory
from learners.batching import make_batch
from learners.checkpoint import CheckpointManager
from learners.config import LearnerConfig
from learners.contract import check_behavior, check_reference_filters, check_token_ids
from learners.distributed import common_length, host_local, local_row_shards, place, shard_batch
from learners.logging import DeferredMetrics, MetricsLogger
from learners.optim import make_optimizer, make_schedule
from learners.state import check_params, create_train_state
from learners.step import make_logprob_fn, make_train_step

__all__ = ["Learner", "LearnerConfig", "NonFiniteError", "NonFiniteGuard", "check_behavior",
           "check_reference_filters"]


@jax.jit
def _copy(tree):
    """A copy of every array of ``tree`` in one compiled program (per tree structure),
    in the same shardings; ``jax.tree.map(jnp.copy, ...)`` compiles one per shape."""
    return jax.tree.map(jnp.copy, tree)


class NonFiniteError(RuntimeError):
    """Raised after too many consecutive steps with a non-finite loss or gradient."""


class NonFiniteGuard:
    """Host-side stop rule: ``max_consecutive`` skipped steps in a row raise `NonFiniteError`.

    Fed the host metrics of each call (``train/skipped``, ``train/applied``, ``loss``,
    ``train/grad_norm``). A call counts as skipped when it had a non-finite loss or
    gradient and applied no update (with one optimizer update per call: that update was
    skipped).
    """

    def __init__(self, max_consecutive: int):
        if max_consecutive < 1:
            raise ValueError(f"NonFiniteGuard: max_consecutive must be >= 1, got {max_consecutive}")
        self.max_consecutive = max_consecutive
        self.consecutive = 0
        self.total = 0

    def update(self, step: int, metrics: Mapping[str, float]) -> None:
        """Count a skipped step or reset the run; raise on the ``max_consecutive``-th in a row."""
        if metrics.get("train/skipped", 0.0) < 0.5 or metrics.get("train/applied", 0.0) >= 0.5:
            self.consecutive = 0
            return
        self.consecutive += 1
        self.total += 1
        if self.consecutive >= self.max_consecutive:
            loss = metrics.get("loss", float("nan"))
            name = "loss" if not math.isfinite(loss) else "train/grad_norm"
            raise NonFiniteError(
                f"step {step}: {self.consecutive} consecutive steps with non-finite {name} "
                f"(= {metrics.get(name)}); updates were skipped, stopping the run"
            )


class Learner:
    """Owns the train state on the mesh and runs RL / SFT steps.

    Args:
      module_fn: builds the policy `nnx.Module` (traced once for shapes, then run inside
        a jit that writes the parameters directly into their shardings).
      config: `LearnerConfig`.
      objective: an `entr_jax.objectives.Objective` (``make_objective``; name, config,
        inputs, batch statistics); None for SFT only.
      logdir: metrics directory (tensorboard + ``metrics.jsonl``), or None.
      checkpoint: a `CheckpointManager`, or None.
      devices: devices of the mesh (default: all).
      ref_params: frozen reference parameters for ``logp_ref`` (same structure as the
        policy's), or None; can be set later with `set_reference`.
      params: initial weights (the `nnx.Param` state of ``module_fn``'s module, e.g. read
        from a Hugging Face checkpoint) instead of ``module_fn``'s random initialisation,
        which is then never materialised (`learners.state.create_train_state`): at the
        0.5B shape, random weights and their optimizer state cost 3x the weights' memory
        before `load_params` could replace them. The arrays are donated when already in
        place; do not use them afterwards.

    Raises:
      ValueError: the objective reads ``logp_ref`` (a KL penalty, e.g. GRPO's ``kl_coef >
        0``) while a sampling filter is on (`check_reference_filters`).
    """

    def __init__(
        self,
        module_fn: Callable[[], nnx.Module],
        config: LearnerConfig,
        *,
        objective: Objective | None = None,
        logdir: str | Path | None = None,
        checkpoint: CheckpointManager | None = None,
        devices: Sequence[Any] | None = None,
        ref_params: Any = None,
        params: nnx.State | None = None,
    ):
        self.config = config
        name = objective.name if objective is not None else "the objective"
        coef = (getattr(objective.config, "kl_coef", None)  # a config field: GRPO's only
                if objective is not None else None)
        check_reference_filters(
            objective.inputs if objective is not None else frozenset(),
            {"top_p": config.top_p, "top_k": config.top_k, "min_p": config.min_p},
            kl=f"{name} (it reads logp_ref)" if coef is None else f"{name}'s kl_coef={coef}",
            kl_off="kl_coef=0",
            field=lambda field, value: f"LearnerConfig.{field}={value!r}")
        self.mesh = make_mesh(config.mesh, devices)
        self.tx = make_optimizer(config.optimizer)
        self.state, self.shardings = create_train_state(module_fn, self.tx, self.mesh, config.seed,
                                                        params=params)
        # the embedding's rows: token ids at or above would embed as NaN (check_token_ids)
        self.vocab_size = getattr(getattr(nnx.eval_shape(module_fn), "config", None),
                                  "vocab_size", None)
        kw = dict(chunk_size=config.logprob_chunk, temperature=config.temperature,
                  top_k=config.top_k, top_p=config.top_p, min_p=config.min_p)
        schedule = make_schedule(config.optimizer)
        self.objective = objective
        self.rl_step = None
        if objective is not None:
            self.rl_step = make_train_step(
                "rl", self.tx, self.shardings, self.mesh, objective=objective,
                lr_schedule=schedule, num_minibatches=config.minibatches,
                num_epochs=config.epochs, **kw,
            )
        self.sft_step = make_train_step("sft", self.tx, self.shardings, self.mesh,
                                        lr_schedule=schedule, **kw)
        self.logprob_fn = make_logprob_fn(self.shardings, self.mesh, **kw)
        inputs = objective.inputs if objective is not None else frozenset()
        self.needs_prox = "logp_prox" in inputs
        self.needs_ref = "logp_ref" in inputs
        self.reads_entropy_mu = "entropy_mu" in inputs
        self.ref_params = None
        if ref_params is not None:
            self.set_reference(ref_params)
        self.last_update_metrics: dict[str, Any] | None = None
        self.checkpoint = checkpoint
        self.logger = MetricsLogger(logdir) if logdir is not None else None
        self.deferred = DeferredMetrics()
        self.guard = NonFiniteGuard(config.max_bad_steps)

    @property
    def version(self) -> int:
        return int(jax.device_get(self.state.version))

    def load_params(self, params: nnx.State) -> None:
        """Start from given weights (the `nnx.Param` state of the same module, e.g. after
        a supervised warm start): placed into the parameter shardings, optimizer state
        re-initialised; ``version`` and ``step`` keep their values. The current weights
        and optimizer state are released first, so two train states never coexist."""
        check_params(self.state.params, params)
        self.state = self.state.replace(params=None, opt_state=None)
        params = jax.device_put(params, self.shardings.params)
        opt_state = jax.jit(self.tx.init, out_shardings=self.shardings.opt_state)(params)
        self.state = self.state.replace(params=params, opt_state=opt_state)

    def hand_over_params(self) -> nnx.State:
        """The current weights, for another learner to train from (e.g. a supervised warm
        start, which takes them with ``Learner(..., params=...)`` and donates them). The
        optimizer state is released; this learner holds no usable weights until
        `load_params` gives it the trained ones."""
        params = self.state.params
        self.state = self.state.replace(opt_state=None)
        return params

    def set_reference(self, params: nnx.State) -> None:
        """Freeze ``params`` (the `nnx.Param` state of the same module) as the reference
        policy of ``logp_ref``; a copy is placed into the parameter shardings, so later
        updates of the policy never change it."""
        self.ref_params = _copy(jax.device_put(params, self.shardings.params))

    def published_weights(self) -> nnx.State:
        """A copy of the full module state (params and buffers) for samplers.

        A copy, because the train step donates the state: a sampler holding the learner's
        own buffers would find them deleted after the next step.
        """
        return _copy(nnx.state(self.state.model()))

    def _device_batch(self, trajectories: Sequence[Trajectory], advantages,
                      minibatches: int = 1) -> tuple[Any, dict]:
        """Host batch (`make_batch`: ``minibatches`` mini-batches of ``microbatches``
        microbatches) placed on the mesh, without extra log-prob passes."""
        c = self.config
        check_token_ids(trajectories, self.vocab_size)
        host, stats = make_batch(
            trajectories, advantages, pad_id=c.pad_id, num_minibatches=minibatches,
            num_microbatches=c.microbatches, row_multiple=local_row_shards(self.mesh),
            min_length=c.min_length, max_length=c.max_length,
            length=common_length(trajectories, min_length=c.min_length, max_length=c.max_length),
            drop_nonfinite_entropy=self.reads_entropy_mu,
        )
        return shard_batch(host, self.mesh), stats

    def prepare(self, trajectories: Sequence[Trajectory], advantages) -> tuple[Any, dict]:
        """Host batch -> device batch (with ``logp_prox``/``logp_ref`` when the objective
        reads them, computed once for the whole rollout batch) + stats.

        Raises:
          ValueError: the trajectories were sampled from another distribution than the
            learner scores (`check_behavior`), or the objective reads ``logp_ref`` and no
            reference was set.
        """
        check_behavior(trajectories, self.config)
        batch, stats = self._device_batch(trajectories, advantages, self.config.minibatches)
        if self.needs_prox:
            batch = batch.replace(logp_prox=self.logprob_fn(self.state.params, self.state.other, batch)[0])
        if self.needs_ref:
            if self.ref_params is None:
                name = self.objective.name
                raise ValueError(f"{name} reads logp_ref (kl_coef > 0) but the learner has no "
                                 "reference policy: call Learner.set_reference first")
            batch = batch.replace(logp_ref=self.logprob_fn(self.ref_params, self.state.other, batch)[0])
        return batch, stats

    def token_logprobs(self, trajectories: Sequence[Trajectory],
                       weights: nnx.State | None = None) -> dict[str, np.ndarray]:
        """Per-token arrays of a policy on these trajectories (no update), for
        diagnostics: ``logp_pi``, ``entropy_pi``, ``logp_mu``, ``entropy_mu``,
        ``token_version`` and ``loss_mask``, each ``[B, T]`` numpy (rows beyond
        ``len(trajectories)`` are padding and are dropped). With several processes every
        process calls it with its own rows and gets those rows back.

        ``weights``: a full module state of this policy (as `published_weights` returns,
        e.g. an older version kept in a parameter ring) to score with instead of the
        current parameters; placed into the parameter shardings first, so the same
        compiled program runs and equal weights give bitwise equal log-probs.

        Raises:
          ValueError: trajectories sampled from another distribution (`check_behavior`).
        """
        check_behavior(trajectories, self.config)
        batch, _ = self._device_batch(trajectories, [0.0] * len(trajectories))
        params, other = self.state.params, self.state.other
        if weights is not None:
            _, params, other = nnx.split(nnx.merge(self.state.graphdef, weights), nnx.Param, ...)
            params = place(params, self.shardings.params)
            other = place(other, self.shardings.other)
        logp, entropy = self.logprob_fn(params, other, batch)
        arrays = {"logp_pi": logp, "entropy_pi": entropy, "logp_mu": batch.logp_mu,
                  "entropy_mu": batch.entropy_mu, "token_version": batch.token_version,
                  "loss_mask": batch.loss_mask}
        host = host_local(arrays, self.mesh)  # this process's rows
        n = len(trajectories)
        return {k: np.asarray(v).reshape(-1, v.shape[-1])[:n] for k, v in host.items()}

    def _run(self, step_fn, batch, stats) -> dict[str, float] | None:
        step_index = int(jax.device_get(self.state.step))
        self.state, metrics, self.last_update_metrics = step_fn(self.state, batch)
        previous = self.deferred.push(step_index, dict(metrics, **stats))
        return self._consume(previous)

    def _consume(self, previous, guard: bool = True) -> dict[str, float] | None:
        if previous is None:
            return None
        step, _, host = previous
        version = int(host["train/version"])
        if self.logger is not None:
            self.logger.log(step, version, host)
        if guard:
            self.guard.update(step, host)
        return host

    def train_on(self, trajectories: Sequence[Trajectory], advantages) -> dict[str, float] | None:
        """Train on one rollout batch (``minibatches x epochs`` optimizer updates;
        ``version`` advances by one if any was applied). Returns the *previous* call's host
        metrics (None on the first); the per-update metrics of this call stay on device in
        ``last_update_metrics`` (``[K]`` arrays)."""
        if self.rl_step is None:
            raise ValueError("Learner.train_on needs an objective")
        batch, stats = self.prepare(trajectories, advantages)
        return self._run(self.rl_step, batch, stats)

    def sft_on(self, trajectories: Sequence[Trajectory]) -> dict[str, float] | None:
        """One SFT step (cross-entropy on ``loss_mask`` tokens); returns the previous metrics."""
        batch, stats = self._device_batch(trajectories, [0.0] * len(trajectories))
        return self._run(self.sft_step, batch, stats)

    def flush(self) -> dict[str, float] | None:
        """Fetch, log and guard the last dispatched step's metrics."""
        return self._consume(self.deferred.flush())

    def save(self, **json_items) -> bool:
        """Checkpoint the current state (asynchronous) with JSON side items."""
        if self.checkpoint is None:
            raise ValueError("Learner.save: no CheckpointManager was given")
        return self.checkpoint.save(self.state, **json_items)

    def restore_latest(self) -> dict | None:
        """Replace the state with the newest readable checkpoint; returns its JSON items."""
        if self.checkpoint is None:
            raise ValueError("Learner.restore_latest: no CheckpointManager was given")
        restored = self.checkpoint.restore_latest(self.state, self.shardings)
        if restored is None:
            return None
        self.state = restored.pop("state")
        self.deferred = DeferredMetrics()
        return dict(restored)

    def close(self) -> None:
        """Log the pending step's metrics (without the guard), finish saves, close files."""
        self._consume(self.deferred.flush(), guard=False)
        if self.checkpoint is not None:
            self.checkpoint.close()
        if self.logger is not None:
            self.logger.close()
