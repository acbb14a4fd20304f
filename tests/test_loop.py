"""The main job end to end on a very small model: reproducibility, staleness, resume,
async mode and configuration errors."""

import dataclasses
import json
import shutil

import jax
import numpy as np
import pytest
from flax import nnx

from entr_jax.assets import tiny_dir
from entr_jax.model import Decoder, ModelConfig, save_pretrained
from entr_jax.staleness import StalenessConfig
from experiments import run as cli
from experiments.configs import QUICKSTART
from experiments.loop import Job, RunExistsError


@pytest.fixture(scope="module")
def small_model_dir(tmp_path_factory):
    """A 2-layer Qwen2 checkpoint with the embedded tokenizer (vocabulary 1024)."""
    path = tmp_path_factory.mktemp("small_model")
    hf = json.loads((tiny_dir() / "config.json").read_text())
    hf.update(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    model = Decoder(ModelConfig.from_hf_config(hf), rngs=nnx.Rngs(0))
    save_pretrained(model, path)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(tiny_dir() / name, path / name)
    return path


def small_config(model_dir, run_dir, **changes):
    q = QUICKSTART
    cfg = dataclasses.replace(
        q, run_dir=str(run_dir), rl_steps=4, token_samples_every=2,
        model=dataclasses.replace(q.model, path=str(model_dir)),
        task=dataclasses.replace(q.task, prompts_per_step=2, samples_per_prompt=3,
                                 max_new_tokens=6, max_total_tokens=6, eval_examples=2,
                                 eval_samples=1, arithmetic_max_chars=5),
        sft=dataclasses.replace(q.sft, steps=0),
        staleness=StalenessConfig(mode="simulated", inter_lag=1, intra_switches=0,
                                  ring_size=2),
        checkpoint=dataclasses.replace(q.checkpoint, every=2, keep=2),
    )
    return dataclasses.replace(cfg, **changes)


def run(cfg, resume=False):
    job = Job(cfg, resume=resume, show_progress=False)
    summary = job.run_job()
    return job, summary


def metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def reference(small_model_dir, tmp_path_factory):
    """One uninterrupted simulated run (inter lag 1), shared by several tests."""
    run_dir = tmp_path_factory.mktemp("reference")
    job, summary = run(small_config(small_model_dir, run_dir))
    return run_dir, job, summary


def test_run_directory_and_summary(reference):
    run_dir, _, summary = reference
    for name in ("config.json", "meta.json", "metrics.jsonl", "timing.jsonl", "summary.json",
                 "eval/init.json", "eval/before_rl.json", "eval/after_rl.json",
                 "token_samples/step_0.npz", "token_samples/step_2.npz"):
        assert (run_dir / name).exists(), name
    assert list((run_dir / "tb").glob("events.out.tfevents.*"))
    assert summary["rl_steps"] == 4
    for key in ("eval_accuracy_before", "eval_accuracy_after", "wall_clock_s"):
        assert isinstance(summary[key], float)
    rows = metrics(run_dir)
    assert [r["batch/id"] for r in rows] == [0, 1, 2, 3]
    assert [r["version"] for r in rows] == [0, 1, 2, 3]
    # fixed lag 1: every batch after the first is exactly one version stale
    assert [r["staleness/inter_max"] for r in rows] == [0, 1, 1, 1]
    assert [r["staleness/inter_mean"] for r in rows] == [0.0, 1.0, 1.0, 1.0]
    assert all(not any(k.startswith(("time/", "throughput/")) for k in r) for r in rows)
    for key in ("loss", "mask/fraction", "kl_mu_pi/k3", "entropy_mu/mean",
                "ratio_by_entropy/b0/count", "reward/mean", "staleness/mean"):
        assert key in rows[-1], key
    z = np.load(run_dir / "token_samples" / "step_2.npz")
    assert z["logp_pi"].shape == z["entropy_mu"].shape == z["loss_mask"].shape


def test_same_seed_same_metrics_other_seed_differs(reference, small_model_dir, tmp_path):
    ref_dir, _, _ = reference
    run(small_config(small_model_dir, tmp_path / "again"))
    assert (tmp_path / "again" / "metrics.jsonl").read_bytes() == (ref_dir / "metrics.jsonl").read_bytes()
    run(small_config(small_model_dir, tmp_path / "seed1", seed=1))
    assert (tmp_path / "seed1" / "metrics.jsonl").read_bytes() != (ref_dir / "metrics.jsonl").read_bytes()


def test_sync_equals_simulated_with_lag_zero(small_model_dir, tmp_path):
    lag0 = StalenessConfig(mode="simulated", inter_lag=0, intra_switches=0, ring_size=1)
    run(small_config(small_model_dir, tmp_path / "lag0", rl_steps=3, staleness=lag0))
    sync = dataclasses.replace(lag0, mode="sync")
    run(small_config(small_model_dir, tmp_path / "sync", rl_steps=3, staleness=sync))
    a = (tmp_path / "lag0" / "metrics.jsonl").read_bytes()
    assert a == (tmp_path / "sync" / "metrics.jsonl").read_bytes()
    assert all(r["staleness/inter_max"] == 0 for r in metrics(tmp_path / "sync"))


def test_intra_switches_are_measured(small_model_dir, tmp_path):
    st = StalenessConfig(mode="simulated", inter_lag=1, intra_switches=2, switch_window=3,
                         ring_size=3)
    cfg = small_config(small_model_dir, tmp_path / "intra", rl_steps=5, staleness=st,
                       token_samples_every=1)
    run(cfg)
    rows = metrics(tmp_path / "intra")
    for r in rows:
        g = r["batch/generation_version"]
        assert r["staleness/intra_max"] <= min(g, 2)
    # per trajectory, from the stored token versions: trajectories that reach the last
    # switch step span exactly min(g, 2) versions, the last one being g
    for n in (3, 4):
        z = np.load(tmp_path / "intra" / "token_samples" / f"step_{n}.npz")
        g = rows[n]["batch/generation_version"]
        for tv, mask in zip(z["token_version"], z["loss_mask"]):
            v = tv[mask]
            if len(v) >= 3:  # switch steps lie in [1, 2]
                assert (v.min(), v.max()) == (g - 2, g)


def test_resume_after_a_crash_repeats_nothing_and_is_bitwise(reference, small_model_dir,
                                                             tmp_path, monkeypatch):
    ref_dir, ref_job, _ = reference
    cfg = small_config(small_model_dir, tmp_path / "crash")
    original = Job.learn

    def crash_at_step_3(self, batch, record):
        if record["step"] == 3:
            raise KeyboardInterrupt("simulated kill")
        return original(self, batch, record)

    monkeypatch.setattr(Job, "learn", crash_at_step_3)
    with pytest.raises(KeyboardInterrupt):
        run(cfg)
    monkeypatch.setattr(Job, "learn", original)
    with pytest.raises(RunExistsError):
        Job(cfg)
    job, _ = run(cfg, resume=True)
    rows = metrics(tmp_path / "crash")
    assert [r["batch/id"] for r in rows] == [0, 1, 2, 3]
    assert (tmp_path / "crash" / "metrics.jsonl").read_bytes() == (ref_dir / "metrics.jsonl").read_bytes()
    leaves = jax.tree.leaves(job.learner.state.params)
    ref_leaves = jax.tree.leaves(ref_job.learner.state.params)
    assert len(leaves) == len(ref_leaves) > 0
    for a, b in zip(leaves, ref_leaves):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_async_mode_bounds_and_measures_staleness(small_model_dir, tmp_path):
    st = StalenessConfig(mode="async", max_staleness=1, intra_switches=0, ring_size=2)
    run(small_config(small_model_dir, tmp_path / "async", rl_steps=4, staleness=st))
    rows = metrics(tmp_path / "async")
    assert [r["batch/id"] for r in rows] == [0, 1, 2, 3]
    assert all(0 <= r["staleness/inter_max"] <= 1 for r in rows)
    timing = [json.loads(x) for x in (tmp_path / "async" / "timing.jsonl").read_text().splitlines()]
    assert all(t["time/wait_s"] >= 0 and t["time/sample_s"] > 0 for t in timing)


@pytest.mark.parametrize("args, field", [
    (["--bogus", "1"], "--bogus"),
    (["--rl_steps", "many"], "rl_steps"),
    (["--staleness.inter_lag", "-1"], "inter_lag"),
    (["--staleness.intra_switches", "3", "--staleness.ring_size", "2"], "intra_switches"),
    (["--objective.name", "nope"], "objective.name"),
    (["--objective.entr.tau", "0"], "tau"),
])
def test_bad_config_fails_before_any_work_naming_the_field(args, field, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.parse(["quickstart", *args])
    text = capsys.readouterr().err + str(exc.value)
    assert field in text


def test_cli_overrides_reach_the_config():
    cfg, opts = cli.parse(["quickstart", "--rl_steps", "7", "--objective.name", "grpo",
                           "--staleness.inter_lag", "5", "--resume"])
    assert (cfg.rl_steps, cfg.objective.name, cfg.staleness.inter_lag) == (7, "grpo", 5)
    assert (opts.resume, opts.resume_override, opts.debug) == (True, False, False)


@pytest.mark.parametrize("mode", ["simulated", "async"])
def test_main_job_drives_an_sglang_fleet(small_model_dir, tmp_path, mode):
    """The job with ``sampler.kind=sglang`` against the fake SGLang server: weights are
    exported and pushed with versions, and the reported versions reach the metrics."""
    from tests.sglang_fake_server import FakeSGLangServer

    server = FakeSGLangServer()
    try:
        st = StalenessConfig(mode=mode, inter_lag=1, intra_switches=0, ring_size=1,
                             max_staleness=1)
        cfg = small_config(small_model_dir, tmp_path / mode, rl_steps=3, staleness=st)
        cfg = dataclasses.replace(cfg, sampler=dataclasses.replace(
            cfg.sampler, kind="sglang", server_urls=(server.url,)))
        run(cfg)
    finally:
        server.stop()
    rows = metrics(tmp_path / mode)
    assert [r["batch/id"] for r in rows] == [0, 1, 2]
    pushed = [int(body["weight_version"]) for route, body in server.calls
              if route == "/update_weights_from_disk"]
    assert pushed == sorted(pushed) and max(pushed) >= 2
    if mode == "simulated":
        assert [r["staleness/inter_max"] for r in rows] == [0, 1, 1]
    else:
        assert all(r["staleness/inter_max"] <= 1 for r in rows)


def test_cli_main_returns_exit_status_zero(reference, small_model_dir, capsys):
    ref_dir, _, summary = reference
    # the reference's own configuration (a resume with another one is refused)
    status = cli.main(["quickstart", "--run_dir", str(ref_dir), "--model.path",
                       str(small_model_dir), "--rl_steps", "4", "--token_samples_every", "2",
                       "--task.prompts_per_step", "2", "--task.samples_per_prompt", "3",
                       "--task.max_new_tokens", "6", "--task.max_total_tokens", "6",
                       "--task.eval_examples", "2", "--task.eval_samples", "1",
                       "--task.arithmetic_max_chars", "5", "--sft.steps", "0",
                       "--staleness.inter_lag", "1", "--staleness.intra_switches", "0",
                       "--staleness.switch_window", "16", "--checkpoint.every", "2",
                       "--resume"])
    assert status == 0  # console scripts do sys.exit(main()): a dict would exit with 1
    captured = capsys.readouterr()
    assert "already finished (summary.json): nothing to resume" in captured.err
    out = captured.out
    assert json.loads(out[:out.rindex("}") + 1])["rl_steps"] == summary["rl_steps"]


@pytest.mark.slow
def test_killed_at_a_random_point_and_resumed_repeats_no_batch(small_model_dir, tmp_path):
    """SIGKILL the CLI at a random moment (seeded), resume, check every batch id once."""
    import os
    import signal
    import subprocess
    import sys
    import time

    run_dir = tmp_path / "killed"
    args = [sys.executable, "-m", "experiments.run", "quickstart", "--run_dir", str(run_dir),
            "--model.path", str(small_model_dir), "--sft.steps", "0", "--rl_steps", "12",
            "--checkpoint.every", "3", "--task.prompts_per_step", "2",
            "--task.samples_per_prompt", "3", "--task.eval_examples", "2",
            "--task.eval_samples", "1", "--task.arithmetic_max_chars", "5"]
    env = dict(os.environ, XLA_FLAGS="")
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    while not (run_dir / "metrics.jsonl").exists() and time.monotonic() < deadline:
        time.sleep(0.2)  # wait until RL has started
    time.sleep(float(np.random.default_rng(0).uniform(0.5, 5.0)))
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = subprocess.run(args + ["--resume"], env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    assert [r["batch/id"] for r in metrics(run_dir)] == list(range(12))
