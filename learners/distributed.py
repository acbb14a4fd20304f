"""Multi-host setup and host -> device batch placement that works for any number of processes.

Every JAX process runs the same program (SPMD). Each process builds its *local* rows of
the optimizer batch on the host (`learners.batching.make_batch`), and
`shard_batch` assembles the global array with
`jax.make_array_from_process_local_data`: nothing here assumes one process. On a single
process it is simply a sharded `device_put`.

Environment for `initialize` (all three must be set together; none set = single process):

* ``ENTR_COORDINATOR_ADDRESS``: ``host:port`` of process 0's coordination service;
* ``ENTR_NUM_PROCESSES``: total number of processes;
* ``ENTR_PROCESS_ID``: this process's index in ``[0, ENTR_NUM_PROCESSES)``.

On managed clusters (Cloud TPU, SLURM, Open MPI) ``jax.distributed.initialize()`` can also
discover these by itself; set ``ENTR_DISTRIBUTED_AUTO=1`` to call it without arguments.

On CPU, cross-process collectives use gloo (``jax_cpu_collectives_implementation``, the
default of jax 0.10; `initialize` sets it when it is unset), so a multi-process run can be
tested on one machine without accelerators.

Each process's rows must be its own: every row shard of the batch axes ``("data",
"fsdp")`` has to live on devices of a single process (`local_row_shards` checks it), so
a tensor-parallel group may not span processes.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh

from entr_jax.sharding import batch_sharding, replicated
from entr_jax.types import BATCH_ROW_FIELDS, Batch, Trajectory
from learners.batching import bucket_length

__all__ = ["common_length", "global_max", "global_sum", "host_local", "initialize",
           "is_main_process", "local_row_shards", "shard_batch"]

_ENV = ("ENTR_COORDINATOR_ADDRESS", "ENTR_NUM_PROCESSES", "ENTR_PROCESS_ID")
_BATCH_FIELDS = BATCH_ROW_FIELDS


def initialize(env: Mapping[str, str] | None = None) -> bool:
    """Call `jax.distributed.initialize` from the environment; a no-op for one process.

    Must run before any other JAX call that touches devices.

    Returns:
      True if the distributed runtime was initialised, False for a single process.

    Raises:
      ValueError: if only some of the ``ENTR_*`` variables are set, or they are not
        integers / in range (naming the variable).
    """
    env = os.environ if env is None else env
    if env.get("ENTR_DISTRIBUTED_AUTO") == "1":
        _cpu_collectives()
        jax.distributed.initialize()
        return True
    present = [name for name in _ENV if env.get(name)]
    if not present:
        return False
    if len(present) != len(_ENV):
        missing = sorted(set(_ENV) - set(present))
        raise ValueError(f"distributed.initialize: {present} set but {missing} missing")
    try:
        num_processes = int(env["ENTR_NUM_PROCESSES"])
        process_id = int(env["ENTR_PROCESS_ID"])
    except ValueError as err:
        raise ValueError(f"distributed.initialize: ENTR_NUM_PROCESSES / ENTR_PROCESS_ID: {err}")
    if num_processes < 1:
        raise ValueError(f"ENTR_NUM_PROCESSES must be >= 1, got {num_processes}")
    if not 0 <= process_id < num_processes:
        raise ValueError(f"ENTR_PROCESS_ID must be in [0, {num_processes}), got {process_id}")
    if num_processes == 1:
        return False
    _cpu_collectives()
    jax.distributed.initialize(
        coordinator_address=env["ENTR_COORDINATOR_ADDRESS"],
        num_processes=num_processes,
        process_id=process_id,
    )
    return True


def _cpu_collectives() -> None:
    """Cross-process collectives on the CPU backend: gloo unless the user chose one (only
    the CPU client reads this option; accelerators keep their own collectives)."""
    if jax.config.jax_cpu_collectives_implementation is None:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")


def is_main_process() -> bool:
    """True on process 0 (the one that logs and writes run-directory files)."""
    return jax.process_index() == 0


def global_sum(value: float) -> float:
    """Sum a host scalar over all processes (identity on one process)."""
    if jax.process_count() == 1:
        return float(value)
    gathered = multihost_utils.process_allgather(np.asarray(value, np.float64))
    return float(np.sum(gathered))


def global_max(value: int) -> int:
    """Maximum of a host integer over all processes (identity on one process)."""
    if jax.process_count() == 1:
        return int(value)
    return int(np.max(multihost_utils.process_allgather(np.asarray(value, np.int64))))


def common_length(trajectories: Sequence[Trajectory], *, min_length: int = 16,
                  max_length: int | None = None) -> int | None:
    """The padded sequence length ``L`` every process uses for its rows of one batch.

    `make_batch` buckets ``L`` from the longest local sequence; with several processes the
    local arrays of one global batch must have the same shape, so ``L`` is bucketed from
    the longest sequence of all processes (`global_max`, a collective: every process calls
    it). Returns None on one process (`make_batch` buckets by itself).
    """
    if jax.process_count() == 1:
        return None
    longest = max((len(t.prompt_ids) + len(t.response_ids) for t in trajectories), default=2)
    return bucket_length(global_max(max(longest, 2)), min_length=min_length,
                         max_length=max_length)


def local_row_shards(mesh: Mesh) -> int:
    """Number of row shards of the batch axes ``("data", "fsdp")`` held by this process.

    `shard_batch` gives every process ``1 / process_count`` of the global rows, so each
    process must own the same number of row shards and no row shard may span processes
    (devices that differ only along ``"tensor"`` hold the same rows).

    Raises:
      ValueError: if a row shard's devices belong to several processes, or processes hold
        different numbers of row shards.
    """
    devices = np.asarray(mesh.devices)
    shards = devices.reshape(mesh.shape["data"] * mesh.shape["fsdp"], -1)
    owners = [{d.process_index for d in row} for row in shards]
    shared = [i for i, o in enumerate(owners) if len(o) > 1]
    if shared:
        raise ValueError(
            f"mesh: batch row shard {shared[0]} spans processes {sorted(owners[shared[0]])}; "
            "each process must own its rows (keep learner.mesh.tensor within one process)")
    counts = np.bincount([next(iter(o)) for o in owners], minlength=jax.process_count())
    if len(set(counts.tolist())) != 1:
        raise ValueError(f"mesh: processes hold unequal numbers of row shards {counts.tolist()}")
    return int(counts[jax.process_index()])


def place(tree: Any, shardings: Any) -> Any:
    """The arrays of ``tree`` placed into ``shardings`` (a matching tree of shardings).

    With one process this is ``jax.device_put``. With several, an array that lives on
    this process only (a process-local copy of a global value that is the same on every
    process, e.g. published weights kept in a parameter ring) cannot be transferred across
    hosts: every process then takes its own shards of its host copy
    (``jax.make_array_from_callback``). Arrays that are already global are resharded."""
    if jax.process_count() == 1:
        return jax.device_put(tree, shardings)

    def one(x, sharding):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return jax.device_put(x, sharding)
        host = np.asarray(x)
        return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

    return jax.tree.map(one, tree, shardings)


def host_local(tree: Any, mesh: Mesh) -> Any:
    """numpy copies of this process's part of every array of ``tree``.

    A fully addressable array (any array on one process) is fetched whole; an array
    spanning processes (e.g. per-token outputs sharded like `shard_batch` rows) gives the
    rows this process supplied, in the same order (the inverse of `shard_batch`).
    """
    def get(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            spec = x.sharding.spec
            x = multihost_utils.global_array_to_host_local_array(x, mesh, spec)
        return np.asarray(jax.device_get(x))

    return jax.tree.map(get, tree)


def shard_batch(batch: Batch, mesh: Mesh, *, row_axis: int = 1) -> Batch:
    """Place a host (numpy) `Batch` of this process's rows on the mesh as global arrays.

    Args:
      batch: microbatched host batch (``[M, b_local, ...]`` fields, as from
        `learners.batching.make_batch`) holding this process's rows.
        ``num_loss_tokens`` must be this process's count; it is summed over processes
        (`global_sum`) so the normaliser covers the whole global batch.
      mesh: the learner mesh; rows shard over ``("data", "fsdp")``.
      row_axis: the axis holding rows (1 for microbatched arrays, 0 for ``[B, ...]``).

    Returns:
      the `Batch` with `jax.Array` fields of global shape (``b_global = b_local *
      process_count``) and ``num_loss_tokens`` a replicated f32 scalar.

    Raises:
      ValueError: if the global row count is not divisible by the number of devices on
        the batch mesh axes (naming the field).
    """
    shards = mesh.shape["data"] * mesh.shape["fsdp"]
    nproc = jax.process_count()

    def put(name, x):
        if x is None:
            return None
        x = np.asarray(x)
        global_shape = list(x.shape)
        global_shape[row_axis] *= nproc
        if global_shape[row_axis] % shards:
            raise ValueError(
                f"shard_batch: Batch.{name} has {global_shape[row_axis]} rows on axis "
                f"{row_axis}, not divisible by data*fsdp = {shards} (pad rows with "
                f"make_batch(row_multiple=...))"
            )
        sharding = batch_sharding(mesh, x.ndim, row_axis)
        return jax.make_array_from_process_local_data(sharding, x, tuple(global_shape))

    fields = {name: put(name, getattr(batch, name)) for name in _BATCH_FIELDS}
    num = batch.num_loss_tokens
    if num is not None:
        num = jax.device_put(np.float32(global_sum(float(num))), replicated(mesh))  # no compile
    return batch.replace(num_loss_tokens=num, **fields)
