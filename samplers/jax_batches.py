"""The device batches of the embedded sampler (`samplers.jax_sampler`): how requests are cut
into batches over the replicas, how big the KV cache of a batch is, and one batch in flight
(prefill, then chunks of decode steps with weight swaps and cache growth between them).

Design:

* **Bucketed static shapes.** The ``R = num_prompts * num_samples`` requests are sorted by
  prompt length and cut into device batches of at most ``max_batch_size`` rows. Each batch
  is padded to a batch bucket (powers of two up to ``max_batch_size``), its prompts to a
  prompt bucket (powers of two, at least ``min_prompt_bucket``) and the response budget to
  a new-token bucket (powers of two), with at most ``M = prompt bucket + new-token
  bucket`` cache slots. One compilation per (bucket triple, filtering on/off, cache size);
  sampling parameters, seeds, stop sets, lengths and weights are traced arguments.
* **A KV cache that grows.** A decode step reads every slot of the cache, so the cache
  holds only the slots the next chunk can write: the prompt bucket doubled until it
  covers them, at most M (`cache_slots`), grown with zeros between chunks. A response
  that stops early never pays for M; at most ``log2(M / P) + 1`` cache sizes are compiled
  (the speed it buys: docs/performance.md).
* **Decode loop.** A Python loop over *chunks*; each chunk is one jitted
  ``lax.while_loop`` of up to ``steps_per_call`` decode steps that exits as soon as every
  row is done (so generation stops early). Chunk boundaries are where weights are swapped
  and where `pause` holds; ``steps_per_call = 1`` gives per-step boundaries.
* **Replicas** (``num_devices > 1``). The device batches are cut so their count is a
  multiple of the replicas, rows spread evenly (`device_batches`), and run in waves, one
  batch per device, all starting from the same snapshot of the installed weights:
  each chunk is dispatched on every device before any is waited for, so the replicas
  decode concurrently, and every input of a replica (weights, sampling arguments) is put
  on its device, since one read from another device's queue would wait for that device's
  work. On CPU this is how the sampler uses more than one core: XLA:CPU runs the small
  matmuls of a decode step on one thread, while each host device runs its own program
  (`docs/performance.md`).
  Weight swaps, the schedule and `pause` act at the same boundaries for all replicas.
  Each jitted function compiles once per device; ``stats`` sum over all device batches.

Weight versions, determinism and the statistics: `samplers.jax_sampler`."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import numpy as np

from entr_jax.types import BehaviorParams, Generation

# KV-cache recomputation after a swap covers the written slots rounded up to a multiple of
# this (one compiled shape per multiple and cache size: at most M / 32 per cache size),
# most of M's cost saved when swaps land early in the response.
RECOMPUTE_GRAIN = 32


def pow2_at_least(n: int, floor: int = 1) -> int:
    """The smallest power of two >= ``n``, at least ``floor``."""
    return max(floor, 1 << max(0, int(n) - 1).bit_length())


def cache_slots(p_bucket: int, new_bucket: int, end_step: int) -> int:
    """KV-cache slots allocated for decode steps up to ``end_step`` (exclusive): the prompt
    bucket doubled until it covers ``p_bucket + end_step`` slots, at most ``p_bucket +
    new_bucket``. Step ``t`` writes the slot of position ``len_b + t - 1 < p_bucket + t``.
    A decode step reads every allocated slot, so this keeps its attention proportional to
    the response so far (at most 2x), with ``log2(M / P) + 1`` cache shapes at most."""
    doublings = pow2_at_least(-(-(p_bucket + end_step) // p_bucket))
    return min(p_bucket * doublings, p_bucket + new_bucket)

@dataclasses.dataclass(frozen=True)
class Programs:
    """The jitted programs a device batch runs (`samplers.jax_decode`, compiled by the
    sampler that owns them): ``prefill``, ``decode_chunk``, ``recompute`` (the KV cache
    under new weights), ``grow`` (more cache slots), and ``dtype`` the compute and cache
    dtype."""

    prefill: Callable[..., Any]
    decode_chunk: Callable[..., Any]
    recompute: Callable[..., Any]
    grow: Callable[..., Any]
    dtype: Any



def device_batches(num_requests: int, max_batch_size: int, replicas: int) -> list[range]:
    """Consecutive request index ranges of the device batches (none for no request).

    One replica: batches of ``max_batch_size`` rows, the last one shorter. Several: the
    fewest batches of at most ``max_batch_size`` rows whose count ``n`` is a multiple of
    ``replicas`` (each wave of ``replicas`` batches runs concurrently, one per device),
    the rows spread evenly: ``R // n`` each, one more for the first ``R % n``; empty
    batches (fewer requests than ``n``) are dropped. E.g. ``R = 10``, at most 4 rows, 2
    replicas: 4 batches of 3, 3, 2, 2 rows."""
    if replicas == 1:
        return [range(s, min(s + max_batch_size, num_requests))
                for s in range(0, num_requests, max_batch_size)]
    count = -(-num_requests // max_batch_size)
    count = -(-count // replicas) * replicas
    size, extra = divmod(num_requests, count) if count else (0, 0)
    out, start = [], 0
    for b in range(count):
        end = start + size + (b < extra)
        if end > start:
            out.append(range(start, end))
        start = end
    return out


@dataclasses.dataclass
class Replica:
    """What one replica's batches share during a call of `samplers.jax_sampler.JaxSampler.generate`: its
    ``device`` (None: JAX's default placement; ``jax.device_put`` then leaves arrays as they
    are and makes host arrays uncommitted), the weight ``schedule`` and the sampling ``args``
    placed there once (every input of a replica lives on its device: an input on another
    device is copied through that device's queue, which waits for the other replica's
    work), and the installed weights placed there, ``installed = (install counter,
    weights)``, replaced when a newer version is installed."""

    device: Any
    schedule: list
    args: Any
    installed: tuple[int, Any] | None = None

    def weights(self, weights: Any, seq: int) -> Any:
        """The installed ``weights`` of install counter ``seq`` on this replica's device."""
        if self.installed is None or self.installed[0] != seq:
            self.installed = (seq, jax.device_put(weights, self.device))
        return self.installed[1]


@dataclasses.dataclass
class BatchRun:
    """One device batch of `samplers.jax_sampler.JaxSampler.generate` in flight on one replica.

    Attributes:
      prompts, request_ids: its rows' prompts and ``(prompt index, sample index)``.
      replica: its `Replica`; p_bucket: its prompt bucket.
      tokens, lens, row_ids, pad_rows: its device inputs (`jax_decode.prefill`).
      weights, version, seen_seq: the weights it decodes with (on its device), their
        version, and the sampler's install counter when they were taken.
      pending: the rest of the weight schedule (on its device).
      state: its `jax_decode.DecodeState`; step: the host's copy of its step; active: it
        has steps left to decode.
    """

    prompts: list
    request_ids: list
    replica: Replica
    p_bucket: int
    tokens: Any
    lens: Any
    row_ids: Any
    pad_rows: Any
    weights: Any
    version: int
    seen_seq: int
    pending: list
    state: Any = None
    step: int = 0
    active: bool = True

    @classmethod
    def start(cls, prompts, request_ids, replica: Replica, installed: tuple[Any, int],
              seq: int, *, max_batch_size: int, min_prompt_bucket: int) -> BatchRun:
        """Pads the batch to its buckets, puts it on its replica's device, and takes the
        weights to start with: ``installed`` (``(weights, version)`` of install counter
        ``seq``, one snapshot per wave), or the schedule's entry for step 0."""
        rows = len(prompts)
        batch = min(pow2_at_least(rows), max_batch_size)
        p_bucket = pow2_at_least(max(len(p) for p in prompts), min_prompt_bucket)
        tokens = np.zeros((batch, p_bucket), np.int32)
        lens = np.ones((batch,), np.int32)
        for r, p in enumerate(prompts):
            tokens[r, :len(p)] = p
            lens[r] = len(p)
        row_ids = np.zeros((batch, 2), np.int32)
        row_ids[:rows] = np.asarray(request_ids, np.int32)
        pad_rows = np.arange(batch) >= rows
        tokens, lens, row_ids, pad_rows = (jax.device_put(x, replica.device)
                                           for x in (tokens, lens, row_ids, pad_rows))
        run = cls(prompts=prompts, request_ids=request_ids, replica=replica, p_bucket=p_bucket,
                  tokens=tokens, lens=lens, row_ids=row_ids, pad_rows=pad_rows,
                  weights=replica.weights(installed[0], seq), version=installed[1],
                  seen_seq=seq, pending=list(replica.schedule))
        while run.pending and run.pending[0][0] <= 0:
            _, run.weights, run.version = run.pending.pop(0)
        return run

    def prefill(self, programs: Programs, new_bucket: int, filtered: bool,
                first_end: int) -> None:
        """Dispatches the prefill (samples response token 0)."""
        self.state = programs.prefill(
            self.weights, self.tokens, self.lens, self.pad_rows, self.row_ids, self.replica.args,
            np.int32(self.version), max_new_bucket=new_bucket,
            cache_len=cache_slots(self.p_bucket, new_bucket, first_end),
            cache_dtype=programs.dtype, filtered=filtered)

    def sync(self, max_new_tokens: int) -> int:
        """Waits for the dispatched work (one transfer of its step and done flags); returns
        the decode steps it advanced."""
        before = self.step
        step, done = jax.device_get((self.state.step, self.state.done))
        self.step = int(step)
        self.active = self.step < max_new_tokens and not done.all()
        return self.step - before

    def decode_chunk(self, programs: Programs, stats: dict[str, float],
                     installed: tuple[Any, int], seq: int, new_bucket: int, filtered: bool,
                     max_new_tokens: int, *, steps_per_call: int,
                     recompute_kv_on_swap: bool) -> None:
        """Dispatches the next chunk of decode steps, after any weight swap that is due
        (newly installed weights, or the schedule's next entry) and the cache growth the
        chunk needs; counts the swap in ``stats["weight_swaps"]``."""
        swapped = False
        if seq != self.seen_seq:
            self.weights = self.replica.weights(installed[0], seq)
            self.version, self.seen_seq, swapped = installed[1], seq, True
        while self.pending and self.pending[0][0] <= self.step:
            _, self.weights, self.version = self.pending.pop(0)
            swapped = True
        state = self.state
        if swapped:
            stats["weight_swaps"] += 1
            if recompute_kv_on_swap:  # only the slots written so far
                length = min(state.cache.max_len,
                             -(-(self.p_bucket + self.step) // RECOMPUTE_GRAIN) * RECOMPUTE_GRAIN)
                state = programs.recompute(self.weights, state, self.tokens, self.lens,
                                            length=length)
        end = min(self.step + steps_per_call, max_new_tokens)
        if self.pending:
            end = min(end, self.pending[0][0])
        slots = cache_slots(self.p_bucket, new_bucket, end)
        if slots > state.cache.max_len:
            state = programs.grow(state, length=slots)
        self.state = programs.decode_chunk(self.weights, state, self.lens, self.row_ids,
                                           self.replica.args, np.int32(self.version),
                                           np.int32(end), filtered=filtered)

    def generations(self, params: Any, vocab_size: int,
                    stats: dict[str, float]) -> list[Generation]:
        """Its rows as `Generation`s (one host transfer), each cut after its first stop
        token or at ``params.max_new_tokens``; counts them in ``stats["tokens_generated"]``."""
        tok, logp, ent, ver = jax.device_get(
            (self.state.tokens, self.state.logp_mu, self.state.entropy_mu,
             self.state.token_version))
        stop = np.zeros((vocab_size,), bool)
        stop[list(params.stop_token_ids)] = True
        gens = []
        for r, prompt in enumerate(self.prompts):
            budget = params.max_new_tokens
            hits = np.flatnonzero(stop[tok[r, :budget]])
            n = int(hits[0]) + 1 if hits.size else budget
            gens.append(Generation(
                prompt_ids=prompt, response_ids=tok[r, :n].copy(), logp_mu=logp[r, :n].copy(),
                entropy_mu=ent[r, :n].copy(), token_version=ver[r, :n].copy(),
                finish_reason="stop" if hits.size else "length",
                behavior=BehaviorParams.of(params),
            ))
            stats["tokens_generated"] += n
        return gens
