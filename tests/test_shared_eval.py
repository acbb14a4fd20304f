"""One initial evaluation shared by the runs of a sweep (`experiments.run.shared_eval`): a run
that reads it writes exactly what a run that computes it writes, and the key separates
every change the evaluation reads."""

import dataclasses
import json
import shutil

import pytest

from entr_jax.staleness import StalenessConfig
from experiments.run import shared_eval
from experiments.run.config import OptimizerConfig
from tests.small_job import run, small_config

TIMES = ("wall_clock_s", "elapsed_s", "rl_wall_s")


def _values(summary):
    """The summary without its wall-clock figures."""
    return {k: v for k, v in summary.items()
            if not k.startswith("time") and k not in TIMES and "_s" not in k}


def test_a_run_reading_the_shared_evaluation_writes_what_computing_it_writes(
        small_model_dir, tmp_path):
    """In the stress regime's shape (inter lag 2 with in-flight switches, so the first
    batches are sampled by version 0 after the first update): a run that read the
    evaluation once sampled from the learner's donated buffers and failed at step 1 (the
    sampler was built on them and only evaluating installed a copy)."""
    store = tmp_path / "store"
    stale = StalenessConfig(mode="simulated", inter_lag=2, intra_switches=2, switch_window=3,
                            ring_size=3)
    cfgs = {name: small_config(small_model_dir, tmp_path / name, rl_steps=4, staleness=stale,
                               shared_eval_dir=str(store) if name != "alone" else "")
            for name in ("first", "second", "alone")}
    summaries = {name: run(cfg)[1] for name, cfg in cfgs.items()}
    first, second, alone = (tmp_path / n for n in ("first", "second", "alone"))
    sources = [json.loads((d / "eval/init_source.json").read_text()) for d in (first, second)]
    assert [s["computed"] for s in sources] == [True, False]
    assert sources[0]["key"] == sources[1]["key"]
    assert sorted(p.name for p in store.iterdir()) == [sources[0]["key"] + ".json",
                                                       sources[0]["key"] + ".json.lock"]
    assert not (alone / "eval/init_source.json").exists()
    for name in ("eval/init.json", "eval/before_rl.json", "eval/after_rl.json", "metrics.jsonl"):
        assert (second / name).read_bytes() == (alone / name).read_bytes() == (
            first / name).read_bytes(), name
    assert _values(summaries["second"]) == _values(summaries["alone"])
    assert summaries["second"]["eval_accuracy_before"] == summaries["alone"][
        "eval_accuracy_before"]


def test_sync_and_stale_runs_evaluate_the_start_alike_and_share_a_key(small_model_dir, tmp_path):
    """What `NOT_READ` leaves out really is not read: a sync GRPO run, a stale ENTR run
    (simulated, 2 in-flight switches, another learning rate) and an async run compute the
    same bytes."""
    base = small_config(small_model_dir, tmp_path / "sync", rl_steps=1,
                        staleness=StalenessConfig(mode="sync", ring_size=1))
    base = dataclasses.replace(base, objective=dataclasses.replace(base.objective, name="grpo"))
    stale = small_config(small_model_dir, tmp_path / "stale", rl_steps=1,
                         staleness=StalenessConfig(mode="simulated", inter_lag=1,
                                                   intra_switches=2, switch_window=3,
                                                   ring_size=3),
                         optim=OptimizerConfig(learning_rate=3e-3),
                         objective=dataclasses.replace(base.objective, name="entr"))
    assert base.objective.name != "entr"
    live = small_config(small_model_dir, tmp_path / "async", rl_steps=1,
                        staleness=StalenessConfig(mode="async", max_staleness=1,
                                                  intra_switches=0, ring_size=2))
    for cfg in (base, stale, live):
        run(cfg)
    init = [(tmp_path / n / "eval/init.json").read_bytes() for n in ("sync", "stale", "async")]
    assert init[0] == init[1] == init[2]
    keys = {shared_eval.key(json.loads(c.to_json())) for c in (base, stale, live)}
    assert len(keys) == 1


def test_the_key_changes_with_what_the_evaluation_reads(small_model_dir, tmp_path):
    base = small_config(small_model_dir, tmp_path / "r")
    k = lambda cfg: shared_eval.key(json.loads(cfg.to_json()))  # noqa: E731
    same = [dataclasses.replace(base, name="other", run_dir="elsewhere", rl_steps=9,
                                shared_eval_dir="somewhere", token_samples_every=0)]
    assert {k(c) for c in same} == {k(base)}
    changed = [
        dataclasses.replace(base, seed=1),
        dataclasses.replace(base, task=dataclasses.replace(base.task, eval_samples=2)),
        dataclasses.replace(base, task=dataclasses.replace(base.task, eval_examples=3)),
        dataclasses.replace(base, sampling=dataclasses.replace(base.sampling, temperature=0.7)),
        dataclasses.replace(base, sampler=dataclasses.replace(base.sampler, logit_noise_std=0.1)),
        dataclasses.replace(base, model=dataclasses.replace(base.model, sampler_dtype="bfloat16")),
        dataclasses.replace(base, learner=dataclasses.replace(base.learner, logprob_chunk=64)),
    ]
    keys = [k(c) for c in changed]
    assert k(base) not in keys and len(set(keys)) == len(keys)
    # the same config over other weights: one byte of the checkpoint flipped
    copy = tmp_path / "weights"
    shutil.copytree(small_model_dir, copy)
    moved = dataclasses.replace(base, model=dataclasses.replace(base.model, path=str(copy)))
    assert k(moved) == k(base)  # the path is in the key only through the bytes it holds
    weights = next(copy.glob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    assert k(moved) != k(base)
