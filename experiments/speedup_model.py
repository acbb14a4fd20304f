"""A discrete-event model of async RL throughput: one learner fed by N sampler nodes.

Used by ``benchmarks/async_speedup.py`` with per-token costs measured on this machine.
Sync baseline (ESTR, arXiv 2607.22186, Table 2: generation and training colocated under
the same hardware budget): each phase runs on all N + 1 nodes, so
``T_sync = S * B * (c_s + c_l) / (N + 1)`` for S steps of B tokens, with ``c_s`` / ``c_l``
the seconds per sampled / trained token on one node (perfect scaling assumed).
"""

from __future__ import annotations

import heapq


def simulate_async(steps: int, n_samplers: int, batch_sample_s: float, batch_learn_s: float,
                   max_staleness: int) -> float:
    """Makespan of ``steps`` learner steps with ``n_samplers`` (discrete events).

    Samplers take batches in order; batch ``b`` may start once ``version >= b -
    max_staleness`` (version = learner steps finished); the learner consumes batches in
    order, one at a time.
    """
    free_at = [0.0] * n_samplers  # when each sampler is next idle
    heapq.heapify(free_at)
    ready = []  # ready time of batch b
    learner_done = []  # finish time of learner step b
    for b in range(steps):
        start = heapq.heappop(free_at)
        gate = b - max_staleness - 1  # needs learner step `gate` finished (version b - bound)
        if gate >= 0:
            start = max(start, learner_done[gate])
        finish = start + batch_sample_s
        heapq.heappush(free_at, finish)
        ready.append(finish)
        prev = learner_done[-1] if learner_done else 0.0
        learner_done.append(max(prev, finish) + batch_learn_s)
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
