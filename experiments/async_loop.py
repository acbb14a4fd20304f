"""Real asynchronous RL: the sampler runs in a thread that overlaps the learner.

The producer thread generates rollout batches in order (batch ``b`` is consumed by learner
step ``b``) with whatever weights the sampler holds; the learner publishes new weights
after every step with ``sampler.update_weights``, which the embedded sampler applies at
its next decode-step boundary (an in-flight update, so one trajectory can span several
versions). The producer waits while it is ``staleness.max_staleness`` versions ahead:
it starts batch ``b`` only once the published version is at least
``b - max_staleness``. Staleness is measured from the recorded token versions, not
assumed; it is not reproducible bit for bit (thread timing decides the versions).

Checkpoints hold the producer still (a lock around "take prompts, generate, enqueue"),
then save the data position and the queued, not yet consumed batches, so a resumed run
neither loses nor repeats a batch.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

import numpy as np
from tqdm import tqdm

from experiments import multiprocess as mp
from experiments import rollouts as ro

_STOP = object()


class Producer(threading.Thread):
    """Generates rollout batches ``first .. last - 1`` into ``out`` (see module docstring)."""

    def __init__(self, job: Any, first: int, last: int, out: queue.Queue):
        super().__init__(name="entr-sampler", daemon=True)
        self.job, self.next_id, self.last, self.out = job, first, last, out
        self.lock = threading.Lock()  # held while a batch is being made
        self.published = threading.Condition()
        self.version = job.learner.version
        self.error: BaseException | None = None
        self._stop_event = threading.Event()

    def publish(self, weights: Any, version: int) -> None:
        """Called by the learner thread after every step."""
        self.job.sampler.update_weights(weights, version)
        with self.published:
            self.version = version
            self.published.notify_all()

    def stop(self) -> None:
        self._stop_event.set()
        with self.published:
            self.published.notify_all()

    def run(self) -> None:
        job = self.job
        bound = job.cfg.staleness.max_staleness
        try:
            while self.next_id < self.last and not self._stop_event.is_set():
                with self.published:
                    while self.version < self.next_id - bound and not self._stop_event.is_set():
                        self.published.wait()
                if self._stop_event.is_set():
                    break
                with self.lock:
                    b = self.next_id
                    start = time.perf_counter()
                    examples = job.local_prompts()
                    params = job._sampling(b, offset=job.prompt_offset)
                    estimated = ro.entropy_estimated_count(job.sampler)
                    trajs = job._episodes(job.sampler, examples, params,
                                          job.cfg.task.samples_per_prompt, job.group_ids(b))
                    versions = [int(v) for t in trajs for v in t.token_version[t.loss_mask]]
                    self.out.put(ro.RolloutBatch(
                        b, max(versions, default=0), trajs, time.perf_counter() - start,
                        first_version=min(versions, default=0),
                        entropy_estimated_tokens=ro.entropy_estimated_count(job.sampler)
                        - estimated))
                    self.next_id += 1
        except BaseException as e:  # surfaced in the learner thread
            self.error = e
        finally:
            self.out.put(_STOP)


def run_async(job: Any, book: dict[str, Any]) -> None:
    """The async counterpart of ``Job._run_simulated`` (same records, measured staleness)."""
    cfg = job.cfg
    start = book["start_step"]
    out: queue.Queue = queue.Queue()
    for b in sorted(job.line.state_dict()["pending"]):  # batches queued at the checkpoint
        out.put(job.line.pop(b))
    producer = Producer(job, start + out.qsize(), cfg.rl_steps, out)
    newest = job.ring.versions[-1]  # the learner's current weights, already copied
    job.sampler.update_weights(job.ring.get(newest), newest)
    job.async_producer = producer
    producer.start()
    bar = tqdm(range(start, cfg.rl_steps), desc=f"RL async ({cfg.objective.name})",
               disable=not job.show_progress, dynamic_ncols=True)
    try:
        for n in bar:
            version = job.learner.version
            wait_start = time.perf_counter()
            batch = out.get()
            wait_s = time.perf_counter() - wait_start
            job.clock.add("rl/wait_s", wait_s)  # sampling overlaps learning here
            if batch is _STOP:
                raise RuntimeError("the sampler thread stopped early") from producer.error
            assert batch.batch_id == n, (batch.batch_id, n)
            sampled = sum(int(np.sum(t.loss_mask)) for t in batch.trajectories)
            record = {"step": n, "version": version, **mp.global_rollout_metrics(batch, version),
                      "time/sample_s": batch.sample_s, "time/wait_s": wait_s,
                      "throughput/sampled_tokens_per_s": sampled / max(batch.sample_s, 1e-9)}
            job.learn(batch, record)
            producer.publish(job.ring.get(job.ring.versions[-1]), job.ring.versions[-1])
            bar.set_postfix(reward=f"{record['reward/mean']:.3f}",
                            inter=record["staleness/inter_mean"],
                            intra=record["staleness/intra_mean"], wait=f"{wait_s:.2f}s")
            every = cfg.checkpoint.every
            if (every and (n + 1) % every == 0) or n + 1 == cfg.rl_steps:
                with producer.lock:  # hold the producer between batches
                    queued = [b for b in list(out.queue) if b is not _STOP]
                    job.checkpoint(book, n + 1, pending=queued)
    finally:
        producer.stop()
        producer.join(timeout=60)
        if producer.error is not None:
            raise RuntimeError("the sampler thread failed") from producer.error
