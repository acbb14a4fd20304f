"""Real asynchronous RL: a producer thread samples while the learner trains.

The producer generates rollout batches in order (batch ``b`` is consumed by learner step
``b``) with whatever weights the sampler holds; every version the learner publishes goes
to the sampler with ``update_weights``, which the embedded sampler applies at its next
decode-step boundary (an in-flight update, so one trajectory can span several versions).
The producer waits while it is ``staleness.max_staleness`` versions ahead: it starts
batch ``b`` only once the published version is at least ``b - max_staleness``.
Staleness is measured from the recorded token versions, not assumed; it is not
reproducible bit for bit (thread timing decides the versions).

A checkpoint holds the producer still (`AsyncSource.hold`: a lock around "take prompts,
generate, enqueue") and saves the data position and the queued, not yet consumed batches,
so a resumed run neither loses nor repeats a batch.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from typing import Any, Callable, ContextManager

from entr_jax import staleness as st
from experiments.run.rollouts import RolloutBatch, entropy_estimated_count
from experiments.run.sources import (MakeEpisodes, fleet_counters, load_line, policy_tokens,
                                 ring_and_line_state, timing)

_STOP = object()


class _Producer(threading.Thread):
    """Generates rollout batches ``first .. last - 1`` into ``out``, at most ``bound``
    versions ahead of the published one."""

    def __init__(self, sampler: Any, episodes: MakeEpisodes, first: int, last: int,
                 bound: int, version: int, out: queue.Queue):
        super().__init__(name="entr-sampler", daemon=True)
        self.sampler, self.episodes, self.bound, self.out = sampler, episodes, bound, out
        self.next_id, self.last, self.version = first, last, version
        self.lock = threading.Lock()  # held while a batch is being made
        self.published = threading.Condition()
        self.error: BaseException | None = None
        self._stop_event = threading.Event()

    def advance(self, version: int) -> None:
        with self.published:
            self.version = version
            self.published.notify_all()

    def stop(self) -> None:
        self._stop_event.set()
        with self.published:
            self.published.notify_all()

    def run(self) -> None:
        try:
            while self.next_id < self.last and not self._stop_event.is_set():
                with self.published:
                    while (self.version < self.next_id - self.bound
                           and not self._stop_event.is_set()):
                        self.published.wait()
                if self._stop_event.is_set():
                    break
                with self.lock:
                    self.out.put(self._make(self.next_id))
                    self.next_id += 1
        except BaseException as e:  # surfaced in the learner thread
            self.error = e
        finally:
            self.out.put(_STOP)

    def _make(self, b: int) -> RolloutBatch:
        start = time.perf_counter()
        estimated = entropy_estimated_count(self.sampler)
        trajs = self.episodes(self.sampler, b)
        versions = [int(v) for t in trajs for v in t.token_version[t.loss_mask]]
        return RolloutBatch(b, max(versions, default=0), trajs, time.perf_counter() - start,
                            first_version=min(versions, default=0),
                            entropy_estimated_tokens=entropy_estimated_count(self.sampler)
                            - estimated)


class AsyncSource:
    """``staleness.mode=async`` (module docstring); a `experiments.run.sources.RolloutSource`.

    Args:
      cfg: the staleness config (``max_staleness``, ``ring_size``).
      steps: the run's learner steps.
      sampler: the sampler (its ``update_weights`` must be safe to call while it decodes).
      episodes: makes this process's trajectories of a batch.
      add_time: ``add_time(name, seconds)`` receives ``rl/wait_s`` per step.

    The ring's newest version (version 0 published, or a restored ring) is what the
    sampler starts with; the delay line's parked batches (those a checkpoint saved) are
    served first.
    """

    mode = "async"

    def __init__(self, cfg: st.StalenessConfig, steps: int, sampler: Any,
                 episodes: MakeEpisodes, *,
                 add_time: Callable[[str, float], None] | None = None):
        self.cfg, self.steps, self.sampler, self.episodes = cfg, steps, sampler, episodes
        self.line, self.ring = st.DelayLine(cfg), st.ParamRing(cfg.ring_size)
        self.next_step = 0
        self.add_time = add_time
        self.out: queue.Queue = queue.Queue()
        self.producer: _Producer | None = None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ring = state["ring"]
        load_line(self.line, state["delay_line"])
        self.next_step = self.line.state_dict()["consumed"]

    def start(self) -> None:
        line = self.line
        for b in sorted(line.state_dict()["pending"]):  # batches queued at the checkpoint
            self.out.put(line.pop(b))
        newest = self.ring.versions[-1]  # the learner's current weights, already copied
        self.sampler.update_weights(self.ring.get(newest), newest)
        self.producer = _Producer(self.sampler, self.episodes, self.next_step + self.out.qsize(),
                                  self.steps, self.cfg.max_staleness, newest, self.out)
        self.producer.start()

    def next_batch(self) -> tuple[RolloutBatch, dict[str, float]]:
        wait_start = time.perf_counter()
        batch = self.out.get()
        wait_s = time.perf_counter() - wait_start
        if self.add_time is not None:
            self.add_time("rl/wait_s", wait_s)  # sampling overlaps learning here
        if batch is _STOP:
            raise RuntimeError("the sampler thread stopped early") from self.producer.error
        assert batch.batch_id == self.next_step, (batch.batch_id, self.next_step)
        self.next_step += 1
        return batch, timing(batch.sample_s, wait_s, policy_tokens(batch))

    def publish(self, weights: Any, version: int) -> None:
        if version not in self.ring.versions:
            self.ring.push(version, weights)
        if self.producer is None:  # not started: `start` hands the newest to the sampler
            return
        newest = self.ring.versions[-1]
        self.sampler.update_weights(self.ring.get(newest), newest)
        self.producer.advance(newest)

    def counters(self) -> dict[str, float]:
        return fleet_counters(self.sampler)

    def pending(self) -> list[RolloutBatch]:
        """Batches made and not yet consumed, oldest first."""
        return [b for b in list(self.out.queue) if b is not _STOP]

    def state_dict(self) -> dict[str, Any]:
        return ring_and_line_state(self.ring, self.line, self.pending(), self.next_step)

    def hold(self) -> ContextManager[Any]:
        return self.producer.lock if self.producer is not None else contextlib.nullcontext()

    def close(self) -> None:
        if self.producer is None:
            return
        self.producer.stop()
        self.producer.join(timeout=60)
        if self.producer.error is not None:
            raise RuntimeError("the sampler thread failed") from self.producer.error
