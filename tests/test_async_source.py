"""`experiments.run.async_source.AsyncSource` on a fake sampler: the staleness bound, real
overlap (the producer runs ahead of the learner), stop, an early producer failure, and a
checkpoint's state served first after a restore. No model, no JAX."""

import threading

import numpy as np
import pytest

from entr_jax.staleness import StalenessConfig
from entr_jax.types import Trajectory
from experiments.run.async_source import AsyncSource

WAIT_S = 30.0  # generous upper bound for a thread to reach a point; never a timing assertion


class FakeSampler:
    """Holds a version; every token it "samples" carries it."""

    def __init__(self):
        self.version = None
        self.updates = []

    def update_weights(self, weights, version):
        self.version = version
        self.updates.append(version)


class Episodes:
    """`MakeEpisodes` stand-in: one 2-token trajectory per batch, tokens of the sampler's
    version; records which batches were made and the published version seen when each
    began; ``gate[b]`` (an Event) holds batch ``b`` until set; ``fail_at`` raises there."""

    def __init__(self, fail_at=None):
        self.made, self.seen = [], {}
        self.gate: dict[int, threading.Event] = {}
        self.started = threading.Condition()
        self.fail_at = fail_at

    def __call__(self, sampler, batch_id):
        with self.started:
            self.seen[batch_id] = sampler.version
            self.started.notify_all()
        if batch_id in self.gate:
            assert self.gate[batch_id].wait(WAIT_S)
        if batch_id == self.fail_at:
            raise ValueError(f"sampler fell over at batch {batch_id}")
        v = sampler.version
        self.made.append(batch_id)
        return [Trajectory(prompt_ids=np.array([1], np.int32),
                           response_ids=np.array([2, 3], np.int32),
                           logp_mu=np.zeros(2, np.float32), entropy_mu=np.zeros(2, np.float32),
                           token_version=np.array([v, v], np.int32),
                           loss_mask=np.array([True, True]), reward=float(batch_id))]

    def wait_started(self, n):
        """Block until ``n`` batches have begun (fails the test after `WAIT_S`)."""
        with self.started:
            assert self.started.wait_for(lambda: len(self.seen) >= n, WAIT_S), self.seen


def source(steps=6, max_staleness=1, episodes=None):
    cfg = StalenessConfig(mode="async", max_staleness=max_staleness, ring_size=2)
    episodes = episodes or Episodes()
    src = AsyncSource(cfg, steps, FakeSampler(), episodes)
    src.publish("w0", 0)
    return src, episodes


def until_blocked(src, episodes, n):
    """Wait until the producer has made ``n`` batches (fails the test after `WAIT_S`)."""
    pause = threading.Event()
    for _ in range(int(WAIT_S / 0.01)):
        if len(episodes.made) >= n:
            break
        pause.wait(0.01)
    assert len(episodes.made) == n, episodes.made


def test_the_producer_runs_ahead_of_the_learner_up_to_the_bound():
    """With max_staleness 2 and no step taken, batches 0, 1, 2 are made (2 ahead of the
    learner's version 0) and batch 3 is not started; each published version lets exactly
    one more batch start, made with the newest weights."""
    src, ep = source(steps=6, max_staleness=2)
    src.start()
    try:
        until_blocked(src, ep, 3)
        threading.Event().wait(0.2)  # give a wrong producer the chance to start batch 3
        assert ep.made == [0, 1, 2] and 3 not in ep.seen
        batch, timing = src.next_batch()  # consuming does not lift the bound: publishing does
        assert batch.batch_id == 0 and batch.generation_version == 0 and 3 not in ep.seen
        assert timing["time/sample_s"] >= 0 and timing["time/wait_s"] >= 0
        src.publish("w1", 1)
        ep.wait_started(4)
        until_blocked(src, ep, 4)
        assert ep.seen[3] == 1 and 4 not in ep.seen  # batch 3 with version 1's weights
        assert [src.next_batch()[0].batch_id for _ in range(3)] == [1, 2, 3]
        assert src.sampler.updates == [0, 1]
    finally:
        src.close()


def test_sampling_overlaps_the_update():
    """Batch 1 is generated while step 0 "trains" (between next_batch and publish), not on
    request: a source that degenerates to sync would make it only at the next call."""
    ep = Episodes()
    ep.gate[1] = threading.Event()
    src, _ = source(steps=3, max_staleness=1, episodes=ep)
    src.start()
    try:
        batch, _ = src.next_batch()
        assert batch.batch_id == 0
        ep.wait_started(2)  # batch 1 began while the learner holds batch 0
        assert ep.seen[1] == 0 and ep.made == [0]
        ep.gate[1].set()
        src.publish("w1", 1)
        assert src.next_batch()[0].batch_id == 1
    finally:
        src.close()


def test_close_stops_a_producer_waiting_on_the_bound():
    src, ep = source(steps=10, max_staleness=0)
    src.start()
    until_blocked(src, ep, 1)
    src.close()
    assert not src.producer.is_alive() and src.producer.error is None
    assert ep.made == [0]


def test_an_early_producer_failure_reaches_the_learner():
    """The producer fails at batch 1: batch 0 is served, the next call raises with the
    sampler's error as the cause, and so does close."""
    src, ep = source(steps=4, max_staleness=2, episodes=Episodes(fail_at=1))
    src.start()
    assert src.next_batch()[0].batch_id == 0
    with pytest.raises(RuntimeError, match="the sampler thread stopped early") as err:
        src.next_batch()
    assert isinstance(err.value.__cause__, ValueError)
    assert str(err.value.__cause__) == "sampler fell over at batch 1"
    with pytest.raises(RuntimeError, match="the sampler thread failed"):
        src.close()


def test_state_dict_round_trip_serves_the_queued_batches_first():
    """A checkpoint after step 0 holds the ring and the batch made ahead (1); a source
    loaded from it serves batch 1 without making it again, then makes 2 and 3."""
    src, ep = source(steps=4, max_staleness=1)
    src.start()
    src.next_batch()
    src.publish("w1", 1)
    until_blocked(src, ep, 3)  # batches 1 and 2 made ahead of version 1
    with src.hold():
        state = src.state_dict()
    src.close()
    assert state["ring"].versions == [0, 1]
    assert state["delay_line"]["consumed"] == 1
    assert sorted(state["delay_line"]["pending"]) == ["1", "2"]

    cfg = StalenessConfig(mode="async", max_staleness=1, ring_size=2)
    ep2 = Episodes()
    resumed = AsyncSource(cfg, 4, FakeSampler(), ep2)
    resumed.load_state_dict(state)
    assert resumed.next_step == 1
    resumed.start()
    try:
        assert [resumed.next_batch()[0].batch_id for _ in range(2)] == [1, 2]
        resumed.publish("w2", 2)
        assert resumed.next_batch()[0].batch_id == 3
        assert ep2.made == [3] and resumed.sampler.updates[0] == 1
    finally:
        resumed.close()


# ------------------------------------------------ the loop (experiments.run.loop) on fakes


class CountingSampler(FakeSampler):
    """A fleet stand-in: ``metrics()`` reports how many batches it has sampled."""

    def __init__(self):
        super().__init__()
        self.sampled = 0

    def metrics(self):
        return {"sglang/batches": self.sampled, "other": 1}


class FakeLearner:
    """Hands over a step's metrics one call late, as `learners.learner.Learner` does."""

    def __init__(self):
        self.version, self.pending, self.calls = 0, None, []

    def train_on(self, trajectories, advantages):
        previous, self.pending = self.pending, {"loss": float(self.version)}
        self.version += 1
        self.calls.append("train")
        return previous

    def flush(self):
        previous, self.pending = self.pending, None
        self.calls.append("flush")
        return previous

    def published_weights(self):
        return f"w{self.version}"


def test_the_loop_pairs_each_step_with_its_own_metrics_and_counters():
    """Every logged step carries its own learner metrics (loss = the version it trained
    at) and the sampler's counters taken when its batch was handed over; a barrier hook
    (a checkpoint every 2 steps) runs after its step is logged; token-sample hooks see
    steps 0 and 2 (offset 0, every 2)."""
    from experiments.run.loop import Hook, run_rl
    from experiments.run.sources import SimulatedSource

    sampler, learner, events = CountingSampler(), FakeLearner(), []

    def episodes(smp, batch_id):  # smp: the source's adapter around ``sampler``
        sampler.sampled += 1
        return Episodes()(sampler, batch_id)

    source = SimulatedSource(StalenessConfig(mode="sync", ring_size=2), 4, sampler, episodes)
    source.publish("w0", 0)
    hooks = [Hook(lambda i: events.append(("sample", i.step)), phase="before_update", every=2,
                  offset=0),
             Hook(lambda i: events.append(("log", i.step, i.learner_metrics["loss"],
                                           i.counters)), phase="logged"),
             Hook(lambda i: events.append(("checkpoint", i.step)), phase="barrier", every=2,
                  at_end=True)]
    run_rl(learner, source, lambda batch: np.zeros(1, np.float32), hooks, 0, 4)
    assert events == [
        ("sample", 0),
        ("log", 0, 0.0, {"sglang/batches": 1.0}), ("log", 1, 1.0, {"sglang/batches": 2.0}),
        ("checkpoint", 1),
        ("sample", 2),
        ("log", 2, 2.0, {"sglang/batches": 3.0}), ("log", 3, 3.0, {"sglang/batches": 4.0}),
        ("checkpoint", 3)]
    assert learner.calls == ["train", "train", "flush", "train", "train", "flush"]
