"""A discrete-event model of async RL throughput: one learner fed by N sampler nodes.

Used by ``benchmarks/async_speedup.py`` with per-token costs measured on this machine.
Sync baseline (ESTR, arXiv 2607.22186, Table 2: generation and training colocated under
the same hardware budget): each phase runs on all N + 1 nodes, so
``T_sync = S * B * (c_s + c_l) / (N + 1)`` for S steps of B tokens, with ``c_s`` / ``c_l``
the seconds per sampled / trained token on one node (perfect scaling assumed).
"""

from __future__ import annotations

import heapq
from typing import Sequence


def _per_batch(cost: float | Sequence[float], steps: int, name: str) -> list[float]:
    if isinstance(cost, (int, float)):
        return [float(cost)] * steps
    cost = [float(c) for c in cost]
    if len(cost) != steps:
        raise ValueError(f"simulate_async: {name} has {len(cost)} entries for {steps} steps")
    return cost


def simulate_async(steps: int, n_samplers: int, batch_sample_s: float | Sequence[float],
                   batch_learn_s: float | Sequence[float], max_staleness: int) -> float:
    """Makespan of ``steps`` learner steps with ``n_samplers`` (discrete events).

    Samplers take batches in order; batch ``b`` may start once ``version >= b -
    max_staleness`` (version = learner steps finished); the learner consumes batches in
    order, one at a time. ``batch_sample_s`` / ``batch_learn_s``: seconds to generate /
    train one batch, the same for every batch or one value per batch (measured per-batch
    costs, e.g. long-tailed generation times).

    Raises:
      ValueError: a per-batch cost list whose length is not ``steps``.
    """
    sample = _per_batch(batch_sample_s, steps, "batch_sample_s")
    learn = _per_batch(batch_learn_s, steps, "batch_learn_s")
    free_at = [0.0] * n_samplers  # when each sampler is next idle
    heapq.heapify(free_at)
    ready = []  # ready time of batch b
    learner_done = []  # finish time of learner step b
    for b in range(steps):
        start = heapq.heappop(free_at)
        gate = b - max_staleness - 1  # needs learner step `gate` finished (version b - bound)
        if gate >= 0:
            start = max(start, learner_done[gate])
        finish = start + sample[b]
        heapq.heappush(free_at, finish)
        ready.append(finish)
        prev = learner_done[-1] if learner_done else 0.0
        learner_done.append(max(prev, finish) + learn[b])
    return learner_done[-1]


def model_table(c_s: float, c_l: float, tokens_per_batch: float, steps: int,
                max_staleness: int, nodes=(1, 2, 4, 8, 16)) -> list[dict]:
    """Predicted ``T_sync / T_async`` for each number of sampler nodes."""
    rows = []
    for n in nodes:
        t_sync = steps * tokens_per_batch * (c_s + c_l) / (n + 1)
        t_async = simulate_async(steps, n, tokens_per_batch * c_s, tokens_per_batch * c_l,
                                 max_staleness)
        rows.append({"sampler_nodes": n, "predicted_speedup": round(t_sync / t_async, 3)})
    return rows
