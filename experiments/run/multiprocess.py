"""What each process of a multi-process run owns, and the host data the processes share.

Every process runs the same job (SPMD, `learners.distributed`). The knobs mean the same at
any process count ``N``:

* **The rollout batch is global.** ``task.prompts_per_step`` ``P`` is the number of
  prompts of one learner step over all processes. Every process reads the same prompt
  stream (same seed, same `entr_jax.data.PromptBatchIterator` position) and keeps its
  share of each batch (`Share.chunk_indices`): with ``K = learner.minibatches`` PPO
  mini-batches the batch is ``K`` consecutive chunks of ``P / K`` prompts, one per
  mini-batch, and process ``k`` keeps the contiguous ``k``-th ``1/N`` of every chunk
  (``P`` must be divisible by ``N K``; with ``K = 1``, prompts ``[k P / N, (k + 1) P /
  N)``). The learner splits a process's rows into ``K`` consecutive chunks
  (`learners.batching.make_batch`) and mini-batch ``j`` is the union of the processes'
  ``j``-th chunks (`learners.distributed.shard_batch`), so mini-batch ``j`` holds exactly
  the prompts of a one-process run's mini-batch ``j`` (docs/learner.md), at any ``N``.
  The union of the shares is the one-process batch, so a run's prompts do not depend on
  ``N``; each prompt keeps its global index as its group id (`Job.group_ids`).
* **Sampling streams.** The share whose first prompt has global index ``o`` is sampled
  with ``experiments.run.rollouts.sampling_seed(seed, batch_id, stream, offset=o)``:
  deterministic, different for every share, and for ``o = 0`` the one-process seed. The
  samplers key each row by its index within a call, so the sampled responses depend on
  ``N`` (with ``K = 1`` those of the first share are the one-process run's); the prompts
  of a step, and of each of its mini-batches, do not.
* **Advantages** are computed from the rewards of all processes (`allgather_json`), so
  batch-level estimators see the whole batch; group estimators are unaffected, since a
  group (a prompt's ``G`` samples) never straddles processes.
* **Metrics are global**: rollout metrics from the union of the rows
  (`global_rollout_metrics`), the learner's row/token counts summed (`global_batch_stats`),
  device metrics come from the global batch; process 0 writes them. Wall-clock figures
  (``time/*``, ``throughput/*``) are process 0's own.
* **Evaluation is split**: every process evaluates a contiguous share of each benchmark
  (`Share.split`, seeds offset like rollouts) and the per-example results are gathered,
  so the metrics cover every example once.
* **Checkpoints** keep every process's data position and delay line
  (`per_process` / `own`) inside the one orbax checkpoint; a run resumes with the number
  of processes that wrote it.
* **Weights for the sampler** are process-local copies (`process_local`): each process's
  sampler runs its own programs on its own devices.

With one process every function here is the identity (or its one-process equivalent), so
single-process runs are unchanged bit for bit.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Sequence

import jax
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils

from experiments.run import rollouts as ro

__all__ = ["Share", "allgather_json", "concat", "gather_rows", "global_batch_stats",
           "global_rollout_metrics", "local_model", "own", "per_process", "process_local"]

# learner stats (`learners.batching.make_batch`) that are counts over rows/tokens: summed
_COUNT_STATS = ("batch/num_rows", "batch/padding_rows", "batch/num_loss_tokens",
                "batch/nonfinite_logp_mu", "batch/nonfinite_entropy_mu",
                "batch/nonfinite_entropy_dropped", "batch/nonfinite_masked")
_MAX_STATS = ("batch/length",)


@dataclasses.dataclass(frozen=True)
class Share:
    """Process ``index`` of ``count`` (default: this process, `current`)."""

    index: int = 0
    count: int = 1

    @classmethod
    def current(cls) -> "Share":
        return cls(jax.process_index(), jax.process_count())

    def bounds(self, n: int, field: str) -> tuple[int, int]:
        """``[start, stop)`` of this process's equal share of ``n`` items.

        Raises:
          ValueError: if ``n`` is not divisible by the process count (naming ``field``).
        """
        if n % self.count:
            raise ValueError(f"{field} = {n} must be divisible by the number of processes "
                             f"({self.count}): each process takes an equal share")
        size = n // self.count
        return self.index * size, (self.index + 1) * size

    def take(self, items: Sequence[Any], field: str) -> list[Any]:
        """This process's equal share of ``items`` (`bounds`)."""
        start, stop = self.bounds(len(items), field)
        return list(items[start:stop])

    def chunk_indices(self, n: int, chunks: int, field: str, chunks_field: str) -> list[int]:
        """Indices of this process's items of a batch of ``n`` split into ``chunks``
        consecutive equal chunks: the contiguous ``index``-th ``1/count`` of every chunk, in
        order. Every process's ``j``-th ``n / (chunks count)`` items are then its share of
        chunk ``j``, and the union over processes of their ``j``-th parts is chunk ``j``.
        One process: ``range(n)`` for any ``n``.

        Raises:
          ValueError: with several processes, ``n`` not divisible by ``chunks * count``
            (naming ``field`` and ``chunks_field``).
        """
        if self.count == 1:
            return list(range(n))
        if n % (chunks * self.count):
            raise ValueError(
                f"{field} = {n} must be divisible by the number of processes ({self.count}) "
                f"times {chunks_field} ({chunks}): each process takes an equal share of every "
                "mini-batch, so that mini-batch j holds the same prompts at any process count")
        size = n // chunks
        start, stop = self.bounds(size, field)
        return [j * size + i for j in range(chunks) for i in range(start, stop)]

    def split(self, n: int) -> tuple[int, int]:
        """``[start, stop)`` of a near-equal contiguous share of ``n`` items (any ``n``;
        the first ``n mod count`` processes get one more; a share may be empty)."""
        size, extra = divmod(n, self.count)
        start = self.index * size + min(self.index, extra)
        return start, start + size + (self.index < extra)


def _bucket(n: int) -> int:
    return max(256, 1 << (n - 1).bit_length())  # few distinct shapes, few compilations


def allgather_json(obj: Any) -> list[Any]:
    """``[obj of process 0, obj of process 1, ...]`` on every process (a collective).

    ``obj`` must be JSON-serialisable; floats round-trip exactly. ``[obj]`` on one process.
    """
    if jax.process_count() == 1:
        return [obj]
    data = np.frombuffer(json.dumps(obj).encode(), np.uint8)
    sizes = multihost_utils.process_allgather(np.asarray(data.size, np.int64))
    padded = np.zeros(_bucket(int(np.max(sizes))), np.uint8)
    padded[:data.size] = data
    gathered = multihost_utils.process_allgather(padded)
    return [json.loads(bytes(row[:int(size)]).decode()) for row, size in zip(gathered, sizes)]


def concat(*lists: Sequence[Any]) -> tuple[list[Any], ...]:
    """Each of ``lists`` concatenated over the processes, in process order (a collective;
    JSON-able items). The lists themselves on one process."""
    parts = allgather_json([list(items) for items in lists])
    return tuple([x for part in parts for x in part[i]] for i in range(len(lists)))


def gather_rows(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every process's ``[n, ...]`` arrays concatenated along rows in process order (a
    collective; shapes must agree across processes). The arrays themselves on one process."""
    if jax.process_count() == 1:
        return arrays
    return {k: np.asarray(multihost_utils.process_allgather(np.asarray(v), tiled=True))
            for k, v in arrays.items()}


def global_rollout_metrics(batch: ro.RolloutBatch, version: int) -> dict[str, Any]:
    """`experiments.run.rollouts.rollout_metrics` of the union of every process's rows of
    ``batch`` (rows in process order; the generation version is the newest of any
    process). A collective."""
    if jax.process_count() == 1:
        return ro.rollout_metrics(batch, version)
    parts = allgather_json([batch.generation_version,
                            ro.trajectory_stats(batch.trajectories, version,
                                                batch.entropy_estimated_tokens)])
    stats = {k: [v for _, s in parts for v in s[k]] for k in parts[0][1]}
    return ro.metrics_from_stats(batch.batch_id, max(g for g, _ in parts), stats, version,
                                 first_version=batch.first_version)


def global_batch_stats(metrics: dict[str, Any]) -> dict[str, Any]:
    """The learner's host batch statistics over all processes: row and token counts
    summed, ``batch/length`` the maximum; other keys unchanged. A collective."""
    keys = [k for k in _COUNT_STATS + _MAX_STATS if k in metrics]
    if jax.process_count() == 1 or not keys:
        return metrics
    values = np.array(allgather_json([float(metrics[k]) for k in keys]), np.float64)
    out = dict(metrics)
    for i, k in enumerate(keys):
        out[k] = float(values[:, i].max() if k in _MAX_STATS else values[:, i].sum())
    return out


def per_process(obj: Any) -> Any:
    """Checkpoint form of a per-process JSON item: ``obj`` itself on one process, else
    ``{"process_count": N, "by_process": [obj of each process]}`` (a collective)."""
    if jax.process_count() == 1:
        return obj
    return {"process_count": jax.process_count(), "by_process": allgather_json(obj)}


def own(stored: Any, name: str) -> Any:
    """This process's item from `per_process`'s checkpoint form.

    Raises:
      ValueError: if the checkpoint was written by another number of processes (naming
        the item and both counts).
    """
    multi = isinstance(stored, dict) and "by_process" in stored
    written = int(stored["process_count"]) if multi else 1
    count = jax.process_count()
    if written != count:
        raise ValueError(f"checkpoint item {name!r} was written by {written} process(es); "
                         f"resume with the same number (ENTR_NUM_PROCESSES={written}), "
                         f"not {count}")
    return stored["by_process"][jax.process_index()] if count > 1 else stored


def process_local(tree: Any) -> Any:
    """A copy of ``tree`` whose arrays live on this process only (for its sampler, the
    parameter ring and exports): a replicated array's local copy, or the whole of an
    array sharded across processes (gathered: a collective). ``tree`` itself on one
    process."""
    if jax.process_count() == 1:
        return tree

    def local(x):
        if not isinstance(x, jax.Array) or x.is_fully_addressable:
            return x
        if x.is_fully_replicated:
            return x.addressable_data(0)
        return jax.numpy.asarray(multihost_utils.process_allgather(x, tiled=True))

    return jax.tree.map(local, tree)


def local_model(state: Any) -> nnx.Module:
    """The policy of a `learners.state.TrainState` with `process_local` weights (for the
    embedded sampler and exports). A collective when weights are sharded across
    processes. ``state.model()`` itself on one process."""
    if jax.process_count() == 1:
        return state.model()
    return nnx.merge(state.graphdef, process_local(nnx.state(state.model())))
