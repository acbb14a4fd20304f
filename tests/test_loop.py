"""The main job end to end on a very small model: reproducibility, staleness, resume,
async mode and configuration errors."""

import dataclasses
import importlib.util
import json
import math

import jax
import numpy as np
import pytest
from flax import nnx

from entr_jax.model import Decoder, ModelConfig
from entr_jax.staleness import StalenessConfig
from experiments.run import build, preflight
from experiments.run import cli
from experiments.run.configs import QUICKSTART
from experiments.run.errors import ConfigError
from experiments.run.job import Job, RunExistsError
from experiments.run.phases import PhaseClock
from experiments.run.rundir import RunDir
from experiments.run.warm_start import warm_start
from experiments.run.preflight import check_devices
from learners.logging import LoggingConfig
from tests.small_job import crash_at, metrics, run, small_config, synthetic
from tests.wandb_history import offline_env, read_run


@pytest.fixture(scope="module")
def reference(small_model_dir, tmp_path_factory):
    """One uninterrupted simulated run (inter lag 1), shared by several tests; it also logs to
    Weights & Biases, offline, when wandb is installed (``logging.wandb``)."""
    run_dir = tmp_path_factory.mktemp("reference")
    changes = {}
    with pytest.MonkeyPatch.context() as mp:
        if importlib.util.find_spec("wandb") is not None:
            offline_env(mp, tmp_path_factory.mktemp("wandb_env"))
            changes["logging"] = LoggingConfig(wandb=True, wandb_mode="offline")
        job, summary = run(small_config(small_model_dir, run_dir, **changes))
    return run_dir, job, summary


def test_run_directory_and_summary(reference):
    run_dir, _, summary = reference
    for name in ("config.json", "meta.json", "metrics.jsonl", "timing.jsonl", "summary.json",
                 "eval/init.json", "eval/before_rl.json", "eval/after_rl.json",
                 "token_samples/step_0.npz", "token_samples/step_2.npz"):
        assert (run_dir / name).exists(), name
    assert list((run_dir / "tb").glob("events.out.tfevents.*"))
    assert summary["rl_steps"] == 4
    # the untrained small policy answers nothing right: rewards and accuracies are 0
    assert (summary["eval_accuracy_before"], summary["eval_accuracy_after"]) == (0.0, 0.0)
    assert isinstance(summary["wall_clock_s"], float)
    rows = metrics(run_dir)
    assert [r["batch/id"] for r in rows] == [0, 1, 2, 3]
    assert [r["version"] for r in rows] == [0, 1, 2, 3]
    # fixed lag 1: every batch after the first is exactly one version stale
    assert [r["staleness/inter_max"] for r in rows] == [0, 1, 1, 1]
    assert [r["staleness/inter_mean"] for r in rows] == [0.0, 1.0, 1.0, 1.0]
    # the summary says what the lag realised: steps 1..3 at the full lag, mean inter 3/4
    assert (summary["staleness_full_lag_steps"], summary["staleness_realised_inter_mean"],
            summary["staleness_realised_intra_mean"]) == (3, 0.75, 0.0)
    assert all(not any(k.startswith(("time/", "throughput/")) for k in r) for r in rows)
    for key in ("loss", "mask/fraction", "kl_mu_pi/k3", "entropy_mu/mean",
                "ratio_by_entropy/b0/count", "reward/mean", "staleness/mean"):
        assert key in rows[-1], key
    z = np.load(run_dir / "token_samples" / "step_2.npz")
    assert sorted(z.files) == ["entropy_mu", "entropy_pi", "logp_mu", "logp_pi", "logp_version",
                               "loss_mask", "token_version"]
    assert {z[k].shape for k in z.files} == {(6, 15)}  # 2 prompts x 3 samples, 15 targets
    mask = z["loss_mask"].astype(bool)
    assert mask.sum() == 36  # every response runs to its 6-token budget
    # step 2 is scored at its tokens' own versions: equal weights give equal log-probs
    np.testing.assert_array_equal(z["logp_version"][mask], z["logp_mu"][mask])
    # each evaluated example's outcome, whose mean is the phase's avg@k and greedy accuracy
    for phase in ("init", "after_rl"):
        agg = json.loads((run_dir / "eval" / f"{phase}.json").read_text())["benchmarks"]
        per = json.loads((run_dir / "eval" / f"{phase}_examples.json").read_text())
        assert per["phase"] == phase and set(per["benchmarks"]) == set(agg)
        for name, m in agg.items():
            k = m["num_samples"] // m["num_examples"]
            counts, greedy = (per["benchmarks"][name][key] for key in ("sampled_correct", "greedy"))
            assert len(counts) == len(greedy) == m["num_examples"]
            assert sum(counts) / k / len(counts) == pytest.approx(m["avg@n"], abs=1e-12)
            assert sum(greedy) / len(greedy) == pytest.approx(m["greedy"], abs=1e-12)


def check_time_split(summary):
    """``time/phases`` adds up to the wall time; the counts are those of the small config:
    2 evaluations (init, after RL; no SFT) x 2 examples x (1 greedy + 1 sample) episodes,
    4 RL batches x 2 prompts x 3 samples."""
    wall = summary["time/phases"]
    parts = ("sft_s", "eval_s", "rl_s", "compile_s", "other_s")
    assert set(wall) == set(parts) | {"total_s"}
    assert sum(wall[k] for k in parts) == pytest.approx(wall["total_s"], abs=1e-6)
    assert wall["total_s"] == summary["wall_clock_s"]
    assert wall["sft_s"] == 0.0 and min(wall["eval_s"], wall["rl_s"], wall["compile_s"]) > 0
    assert set(summary["time/phases_cpu"]) == {"sft_s", "eval_s", "rl_s", "total_s"}
    assert {"rl/sample_s", "rl/learn_s", "rl/checkpoint_s", "rl/token_samples_s"} <= set(
        summary["time/rl_split"])
    counts = summary["time/counts"]
    assert counts["eval_episodes"] == 2 * 2 * 2 and counts["rl_episodes"] == 4 * 2 * 3
    assert "sft_steps" not in counts
    # the arithmetic task scores exactly: no answer reaches the math verifier
    assert counts["verifier_checks"] == counts["verifier_math_verify"] == 0
    assert counts["compilations"] == sum(summary["time/compilations_by_function"].values()) > 0


def test_summary_splits_the_wall_time_into_phases(reference):
    check_time_split(reference[2])


def test_wandb_run_has_the_metrics_of_metrics_jsonl(reference):
    """With ``logging.wandb``, W&B gets every metric of ``metrics.jsonl`` under the same name,
    with the same value, at the same step (``version``: the batch's policy version;
    ``train/version``: the learner's after the step), plus the timing keys, as TensorBoard
    does; ``wandb.json`` says where the offline run is."""
    pytest.importorskip("wandb")
    run_dir, _, _ = reference
    record = json.loads((run_dir / "wandb.json").read_text())
    assert record["mode"] == "offline" and record["url"] is None and record["name"] == "quickstart"
    rows, config = read_run(record["path"])
    assert config["objective"]["name"] == "entr" and config["rl_steps"] == 4
    jsonl = metrics(run_dir)
    assert [r["step"] for r in jsonl] == [0, 1, 2, 3]
    # plus the evaluation after RL, logged at the final policy version (4) as in TensorBoard
    assert sorted(rows) == [0, 1, 2, 3, 4]
    evaluated = [k for k in rows[4] if not k.startswith("_")]
    assert evaluated and all(k.startswith("eval/after_rl/arithmetic/") for k in evaluated), evaluated
    for r in jsonl:
        row = rows[r["step"]]
        assert (row["version"], row["train/version"]) == (r["version"], r["version"] + 1)
        numeric = {k: v for k, v in r.items() if k != "step"
                   and (isinstance(v, (int, float)) or v in ("nan", "inf", "-inf"))}
        assert len(numeric) > 20
        for key, value in numeric.items():
            assert key in row, key
            if isinstance(value, str):
                assert math.isnan(float(row[key])) if value == "nan" else row[key] == float(value)
            else:
                assert row[key] == value, key
        assert any(k.startswith("time/") for k in row)  # timing.jsonl's keys too, as in TB


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
    for n, r in enumerate(rows):
        g = r["batch/generation_version"]
        assert r["staleness/intra_max"] <= min(g, 2)
        # planned: lag min(n, 1) of the newest weights, min(g, 2) switches; every trajectory
        # is exactly inter + intra = planned total old, and what the switches it missed add
        # to its inter staleness is reported (6 trajectories per batch)
        assert (r["staleness/inter_planned"], r["staleness/intra_planned"]) == (min(n, 1), min(g, 2))
        assert r["staleness/total_mean"] == min(n, 1) + min(g, 2)
        assert r["staleness/inter_mean"] * 6 == pytest.approx(
            6 * min(n, 1) + r["staleness/unrealised_switches"])
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
    with pytest.raises(KeyboardInterrupt, match="simulated crash at step 3"):
        run(cfg, hooks=[crash_at(3)])
    with pytest.raises(RunExistsError):
        Job(cfg)
    job, summary = run(cfg, resume=True)
    rows = metrics(tmp_path / "crash")
    assert [r["batch/id"] for r in rows] == [0, 1, 2, 3]
    assert (tmp_path / "crash" / "metrics.jsonl").read_bytes() == (ref_dir / "metrics.jsonl").read_bytes()
    leaves = jax.tree.leaves(job.parts.learner.state.params)
    ref_leaves = jax.tree.leaves(ref_job.parts.learner.state.params)
    assert len(leaves) == len(ref_leaves) > 0
    for a, b in zip(leaves, ref_leaves):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    check_time_split(summary)  # the counts continue from the checkpoint: none lost or doubled


def test_async_mode_bounds_and_measures_staleness(small_model_dir, tmp_path):
    st = StalenessConfig(mode="async", max_staleness=1, intra_switches=0, ring_size=2)
    run(small_config(small_model_dir, tmp_path / "async", rl_steps=4, staleness=st))
    rows = metrics(tmp_path / "async")
    assert [r["batch/id"] for r in rows] == [0, 1, 2, 3]
    assert all(0 <= r["staleness/inter_max"] <= 1 for r in rows)
    timing = [json.loads(x) for x in (tmp_path / "async" / "timing.jsonl").read_text().splitlines()]
    assert all(t["time/wait_s"] >= 0 and t["time/sample_s"] > 0 for t in timing)


_SGLANG = ["--sampler.kind", "sglang", "--sampler.server_urls", "http://127.0.0.1:30000",
           "--staleness.intra_switches", "0"]


@pytest.mark.parametrize("args, field", [
    (["--bogus", "1"], "--bogus"),
    (["--rl_steps", "many"], "rl_steps"),
    (["--staleness.inter_lag", "-1"], "inter_lag"),
    (["--staleness.intra_switches", "3", "--staleness.ring_size", "2"], "intra_switches"),
    (["--objective.name", "nope"], "objective.name"),
    (["--objective.entr.tau", "0"], "tau"),
    # issue 11: sampling filters the learner could not match, entropy sources that do not
    # say what the sampler provides, verifier limits, unreachable switch steps
    (_SGLANG + ["--objective.entr.entropy_source", "behavior_topk", "--sampling.top_p", "0.9"],
     "sampling.top_p"),
    (_SGLANG + ["--objective.entr.entropy_source", "behavior_topk", "--sampling.top_k", "5"],
     "sampling.top_k"),
    (_SGLANG + ["--objective.entr.entropy_source", "behavior_topk", "--sampling.min_p", "0.1"],
     "sampling.min_p"),
    (_SGLANG, "objective.entr.entropy_source"),
    (["--objective.entr.entropy_source", "behavior_topk"], "objective.entr.entropy_source"),
    (["--sampling.top_p", "1.5"], "sampling.top_p"),
    (["--sampling.temperature", "0"], "sampling.temperature"),
    (["--verifier.num_workers", "0"], "verifier.num_workers"),
    (["--verifier.timeout_s", "0"], "verifier.timeout_s"),
    (["--staleness.switch_window", "13"], "staleness.switch_window"),
    (["--sampler.num_devices", "0"], "sampler.num_devices"),
    (_SGLANG + ["--sampler.num_devices", "2"], "sampler.num_devices"),
])
def test_bad_config_fails_before_any_work_naming_the_field(args, field, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.parse(["quickstart", *args])
    text = capsys.readouterr().err + str(exc.value)
    assert field in text


def test_cli_overrides_reach_the_config(tmp_path):
    cfg, opts = cli.parse(["quickstart", "--rl_steps", "7", "--objective.name", "grpo",
                           "--staleness.inter_lag", "5", "--resume"])
    assert (cfg.rl_steps, cfg.objective.name, cfg.staleness.inter_lag) == (7, "grpo", 5)
    assert (opts.resume, opts.resume_override, opts.debug) == (True, False, False)
    cfg, _ = cli.parse(["quickstart", "--sampling.temperature", "0.7", "--sampling.top_p", "0.9",
                        "--sampling.top_k", "20", "--sampling.min_p", "0.05",
                        "--verifier.num_workers", "2", "--verifier.timeout_s", "3"])
    assert (cfg.verifier.num_workers, cfg.verifier.timeout_s) == (2, 3.0)
    lc = build.learner_config(cfg, cfg.optim, pad_id=0)  # what the learner will score
    assert (lc.temperature, lc.top_k, lc.top_p, lc.min_p) == (0.7, 20, 0.9, 0.05)
    # the same filters are refused with SGLang; without them the SGLang config builds
    cfg, _ = cli.parse(["quickstart", *_SGLANG, "--objective.entr.entropy_source", "behavior_topk"])
    assert cfg.sampler.kind == "sglang" and cfg.objective.entr.entropy_source == "behavior_topk"


@pytest.mark.parametrize("mode", ["simulated", "async"])
def test_main_job_drives_an_sglang_fleet(small_model_dir, tmp_path, mode, monkeypatch):
    """The job with ``sampler.kind=sglang`` against the fake SGLang server: weights are
    exported and pushed with versions, and the reported versions reach the metrics; the
    fleet's counters are logged with every step; the API key is read from the variable
    ``sampler.api_key`` names and is written nowhere in the run directory."""
    from tests.sglang_fake_server import FakeSGLangServer

    key = "s3cret-fleet-key"
    monkeypatch.setenv("ENTR_TEST_SGLANG_KEY", key)
    server = FakeSGLangServer(api_key=key)
    server.faults.extend([None, "503"])  # the second request is retried
    try:
        st = StalenessConfig(mode=mode, inter_lag=1, intra_switches=0, ring_size=1,
                             max_staleness=1)
        cfg = small_config(small_model_dir, tmp_path / mode, rl_steps=3, staleness=st)
        cfg = dataclasses.replace(
            cfg, sampler=dataclasses.replace(cfg.sampler, kind="sglang", server_urls=(server.url,),
                                             api_key="env:ENTR_TEST_SGLANG_KEY"),
            objective=dataclasses.replace(cfg.objective, entr=dataclasses.replace(
                cfg.objective.entr, entropy_source="behavior_topk")))
        run(cfg)
    finally:
        server.stop()
    assert set(server.auth_headers) <= {f"Bearer {key}", None}
    stored = [p for p in (tmp_path / mode).rglob("*") if p.is_file()]
    assert len(stored) > 10 and not [p for p in stored if key.encode() in p.read_bytes()]
    rows = metrics(tmp_path / mode)
    assert rows[-1]["sglang/http_errors"] == 1 and rows[-1]["sglang/retries"] == 1
    assert all(r["sglang/servers_unhealthy"] == 0 and r["sglang/tokens"] > 0 for r in rows)
    assert [r["sglang/tokens"] for r in rows] == sorted(r["sglang/tokens"] for r in rows)
    assert [r["batch/id"] for r in rows] == [0, 1, 2]
    pushed = [int(body["weight_version"]) for route, body in server.calls
              if route == "/update_weights_from_disk"]
    assert pushed == sorted(pushed) and max(pushed) >= 2
    if mode == "simulated":
        assert [r["staleness/inter_max"] for r in rows] == [0, 1, 1]
    else:
        assert all(r["staleness/inter_max"] <= 1 for r in rows)
    # the fake server reports no entropy: every policy token's entropy_mu is a top-k
    # estimate, and the run records exactly that per batch
    for r in rows:
        assert r["sampler/entropy_estimated_frac"] == 1.0
        assert r["sampler/entropy_estimated_tokens"] == round(
            r["response/length_mean"] * 6)  # P * G = 2 * 3 trajectories


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


# ---------------------------------------------------------------- reference policy (KL)


def _kl_to(job, ref_params) -> float:
    """KL(pi || ref) over the full vocabulary, averaged over the answer positions of the
    first 16 demonstrations (fixed contexts, so both runs are measured on the same states)."""
    from experiments.run.tasks import demo_trajectory

    learner = job.parts.learner
    trajs = [demo_trajectory(d, job.parts.tokenizer) for d in job.parts.task.demos[:16]]
    batch, _ = learner._device_batch(trajs, [0.0] * len(trajs))
    tokens, attention = (np.asarray(x).reshape(-1, x.shape[-1]) for x in (batch.tokens, batch.attention_mask))
    mask = np.asarray(batch.loss_mask).reshape(-1, tokens.shape[1] - 1)
    ref = nnx.merge(learner.state.graphdef, jax.device_put(ref_params, learner.shardings.params),
                    learner.state.other)

    @jax.jit
    def kl(tokens, attention):
        lp = jax.nn.log_softmax(learner.state.model()(tokens, attention)[:, :-1], axis=-1)
        lr = jax.nn.log_softmax(ref(tokens, attention)[:, :-1], axis=-1)
        return (jax.numpy.exp(lp) * (lp - lr)).sum(-1)

    return float(np.asarray(kl(tokens, attention))[mask].mean())


def _model_params(model_dir):
    """The weights in ``model_dir``, in the layer layout of the quickstart's learner."""
    from entr_jax.model import from_pretrained

    model = from_pretrained(str(model_dir), scan_layers=QUICKSTART.model.scan_layers)
    return nnx.split(model, nnx.Param, ...)[1]


def kl_config(model_dir, run_dir, coef):
    from entr_jax.objectives import GrpoConfig
    from learners.optim import OptimizerConfig

    q = small_config(model_dir, run_dir, rl_steps=3)
    return dataclasses.replace(
        q, objective=dataclasses.replace(q.objective, name="grpo", grpo=GrpoConfig(kl_coef=coef)),
        optim=OptimizerConfig(learning_rate=1e-2, max_grad_norm=1.0),
        learner=dataclasses.replace(q.learner, minibatches=2))


KL_COEF = 20.0


@pytest.fixture(scope="module")
def kl_runs(small_model_dir, tmp_path_factory):
    """GRPO with kl_coef 0 and KL_COEF (same seed, synthetic advantages, LR 1e-2, 2
    mini-batches per rollout batch)."""
    out = {}
    for coef in (0.0, KL_COEF):
        d = tmp_path_factory.mktemp(f"kl{coef}")
        out[coef] = (d, run(kl_config(small_model_dir, d, coef), advantages=synthetic)[0])
    return out


def test_kl_to_the_reference_pulls_the_policy_towards_it(kl_runs, small_model_dir):
    warm = _model_params(small_model_dir)
    (d0, job0), (d1, job1) = kl_runs[0.0], kl_runs[KL_COEF]
    # the frozen reference is the warm start (model.path here), bit for bit
    assert job0.parts.learner.ref_params is None and not (d0 / "reference.npz").exists()
    for a, b in zip(jax.tree.leaves(job1.parts.learner.ref_params), jax.tree.leaves(warm)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    kl0, kl1 = _kl_to(job0, warm), _kl_to(job1, warm)
    # measured on this setup: kl0 = 0.0202 (the policy moved), kl1 = 0.0133 (KL_COEF = 20;
    # 0.0143 with 5): the KL term keeps the policy a third closer in 3 rollout batches
    assert kl0 > 1e-2
    assert kl1 < 0.8 * kl0, (kl0, kl1)
    rows0, rows1 = metrics(d0), metrics(d1)
    assert [r["batch/id"] for r in rows1] == [0, 1, 2]
    assert "kl/k3" in rows1[-1] and "kl/k3" not in rows0[-1]
    # two optimizer updates per rollout batch, one policy version per rollout batch
    assert [r["version"] for r in rows1] == [0, 1, 2]
    assert all(r["train/optimizer_steps"] == 2.0 and r["train/applied"] == 2.0 for r in rows1)
    assert [r["staleness/inter_max"] for r in rows1] == [0, 1, 1]


def _tensorboard_scalar_tags(logdir) -> set[str]:
    """Scalar tags in the TFRecord event files under ``logdir`` (length, crc, event, crc)."""
    import struct

    from tensorboardX.proto import event_pb2

    tags = set()
    for path in logdir.glob("events.out.tfevents.*"):
        data = path.read_bytes()
        pos = 0
        while pos + 12 <= len(data):
            (length,) = struct.unpack("<Q", data[pos:pos + 8])
            event = event_pb2.Event.FromString(data[pos + 12:pos + 12 + length])
            pos += 12 + length + 4
            tags.update(v.tag for v in event.summary.value)
    return tags


@pytest.mark.slow
def test_reference_policy_survives_resume(kl_runs, small_model_dir, tmp_path, monkeypatch):
    """Killed at step 2 and resumed: the same reference (bit for bit) and the same metrics
    as the uninterrupted run."""
    d1, job1 = kl_runs[KL_COEF]
    cfg = kl_config(small_model_dir, tmp_path / "crash", KL_COEF)
    with pytest.raises(KeyboardInterrupt, match="simulated crash at step 2"):
        run(cfg, hooks=[crash_at(2)], advantages=synthetic)
    job, _ = run(cfg, resume=True, advantages=synthetic)
    for a, b in zip(jax.tree.leaves(job.parts.learner.ref_params), jax.tree.leaves(job1.parts.learner.ref_params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert (tmp_path / "crash" / "metrics.jsonl").read_bytes() == (d1 / "metrics.jsonl").read_bytes()


def test_reference_file_round_trip_and_errors(tmp_path):
    import jax.numpy as jnp

    from experiments.run import reference

    params = {"w": jnp.arange(6, dtype=jnp.bfloat16).reshape(2, 3) / 7, "b": jnp.linspace(0, 1, 5)}
    reference.save(tmp_path / "r.npz", params)
    back = reference.load(tmp_path / "r.npz", template=params)
    for k in params:
        assert back[k].dtype == params[k].dtype
        np.testing.assert_array_equal(np.asarray(back[k]).view(np.uint8), np.asarray(params[k]).view(np.uint8))
    with pytest.raises(FileNotFoundError, match="logp_ref"):
        reference.load(tmp_path / "missing.npz", template=params)
    with pytest.raises(ValueError, match="dtype"):
        reference.load(tmp_path / "r.npz", template={"w": params["w"].astype(jnp.float32), "b": params["b"]})
    # attach: a fresh run freezes the current weights and writes them; a resumed run (whose
    # weights have moved on) gets the saved ones back; objectives without logp_ref get none
    import types

    got = {}
    learner = types.SimpleNamespace(objective=types.SimpleNamespace(inputs=frozenset({"logp_ref"})),
                                    state=types.SimpleNamespace(params=params),
                                    set_reference=lambda p: got.update(ref=p))
    assert reference.attach(learner, tmp_path / "run", fresh=True)
    learner.state.params = jax.tree.map(lambda x: x + 1, params)
    assert reference.attach(learner, tmp_path / "run", fresh=False)
    for k in params:
        np.testing.assert_array_equal(np.asarray(got["ref"][k]), np.asarray(params[k]))
    learner.objective.inputs = frozenset()
    assert not reference.attach(learner, tmp_path / "other", fresh=True)
    assert not (tmp_path / "other").exists()


def test_visibility_metrics_reach_metrics_jsonl_and_tensorboard(reference):
    run_dir, _, _ = reference
    row = metrics(run_dir)[-1]
    keys = ("reward/zero_variance_group_frac", "ess/token_fraction", "ess/seq_fraction",
            "tokens/entropy_mu_unknown", "batch/nonfinite_entropy_dropped")
    for key in keys:
        assert key in row, key
    # every group's rewards are equal (0): all zero-variance; no ratio far from 1 (ESS 1)
    assert {k: row[k] for k in keys} == {
        "reward/zero_variance_group_frac": 1.0, "ess/token_fraction": 1.0,
        "ess/seq_fraction": 1.0, "tokens/entropy_mu_unknown": 0.0,
        "batch/nonfinite_entropy_dropped": 0.0}
    tags = _tensorboard_scalar_tags(run_dir / "tb")
    for key in keys:
        assert key in tags, key


def test_rollout_metrics_zero_variance_groups():
    from entr_jax.types import Trajectory
    from experiments.run.rollouts import RolloutBatch, rollout_metrics

    def traj(group, reward):
        z = np.zeros(2)
        return Trajectory(prompt_ids=np.ones(1, np.int32), response_ids=np.ones(2, np.int32),
                          logp_mu=z, entropy_mu=z, token_version=np.zeros(2, np.int32),
                          loss_mask=np.ones(2, bool), reward=reward, group_id=group)

    # groups 0 and 2 have equal rewards (0, 0 and 1, 1), group 1 does not: 2 of 3
    trajs = [traj(0, 0.0), traj(0, 0.0), traj(1, 1.0), traj(1, 0.0), traj(2, 1.0), traj(2, 1.0)]
    m = rollout_metrics(RolloutBatch(0, 0, trajs), 0)
    assert m["reward/zero_variance_group_frac"] == pytest.approx(2 / 3)


def test_dr_grpo_l_norm_defaults_to_the_generation_budget():
    from experiments.run.objective import build_objective

    q = QUICKSTART
    grpo = dataclasses.replace(q.objective.grpo, aggregation="seq_mean_token_sum_norm")
    cfg = dataclasses.replace(q, objective=dataclasses.replace(q.objective, name="grpo", grpo=grpo),
                              task=dataclasses.replace(q.task, max_new_tokens=12, max_turns=3,
                                                       max_total_tokens=30))
    assert build_objective(cfg).config.l_norm == 30.0  # min(12 * 3, 30)
    cfg = dataclasses.replace(cfg, task=dataclasses.replace(cfg.task, max_total_tokens=100))
    assert build_objective(cfg).config.l_norm == 36.0
    explicit = dataclasses.replace(grpo, l_norm=50.0)
    cfg = dataclasses.replace(cfg, objective=dataclasses.replace(cfg.objective, grpo=explicit))
    assert build_objective(cfg).config.l_norm == 50.0
    with pytest.raises(ValueError, match="learner.minibatches"):
        dataclasses.replace(q, learner=dataclasses.replace(q.learner, minibatches=16 * 8 + 1))


def test_sft_batches_are_padded_to_the_longest_demonstration(small_model_dir, tmp_path,
                                                             monkeypatch):
    """The warm start pads every batch to the longest demonstration (not to the next power
    of two): one shape, fewer tokens."""
    import learners.learner as learner_module
    from experiments.run.tasks import demo_trajectory

    cfg = small_config(small_model_dir, tmp_path / "sft",
                       sft=dataclasses.replace(QUICKSTART.sft, steps=3, batch_size=4))
    run_dir, clock = RunDir(cfg.run_dir), PhaseClock()
    run_dir.start(cfg.to_json())
    model_cfg = preflight.read_model_config(cfg.model.path)
    parts = build.build(cfg, run_dir, build.prepare_task(cfg, model_cfg), model_cfg, clock)
    lengths = []
    make_batch = learner_module.make_batch

    def recording(*args, **kwargs):
        batch, stats = make_batch(*args, **kwargs)
        lengths.append(stats["batch/length"])
        return batch, stats

    monkeypatch.setattr(learner_module, "make_batch", recording)
    clock.start()
    warm_start(cfg, parts.task, parts.tokenizer, parts.module_fn,
               parts.learner.hand_over_params(),
               lambda *a, **k: build.learner_config(cfg, *a, **k), parts.share, run_dir, clock,
               show_progress=False)
    clock.stop()
    seqs = [demo_trajectory(d, parts.tokenizer) for d in parts.task.demos]
    longest = max(len(t.prompt_ids) + len(t.response_ids) for t in seqs)
    assert longest < 16 and lengths == [longest] * 3
    assert clock.split()["counts"] == {"sft_steps": 3}


def test_sft_warm_start_trains_the_model_path_weights(small_model_dir, tmp_path):
    """The supervised warm start starts from ``model.path``'s weights, not from a random
    init (it used to build its learner from ``model.init_seed`` and drop the loaded model):
    at a learning rate of 1e-9 one SFT step leaves the loaded weights within 1e-7, while
    the random init of seed 5 is far from them."""
    cfg = small_config(small_model_dir, tmp_path / "sft_from_path", rl_steps=0,
                       model=dataclasses.replace(QUICKSTART.model, path=str(small_model_dir),
                                                 init_seed=5),
                       sft=dataclasses.replace(QUICKSTART.sft, steps=1, batch_size=4,
                                               learning_rate=1e-9, warmup_steps=0))
    run(cfg)
    loaded = dict(nnx.to_flat_state(_model_params(small_model_dir)))
    trained = dict(nnx.to_flat_state(_model_params(tmp_path / "sft_from_path" / "sft_model")))
    random_init = dict(nnx.to_flat_state(nnx.split(
        Decoder(ModelConfig.from_hf_config(json.loads(
            (small_model_dir / "config.json").read_text())), rngs=nnx.Rngs(5),
            scan_layers=QUICKSTART.model.scan_layers), nnx.Param, ...)[1]))
    assert set(trained) == set(loaded)
    for path, value in loaded.items():
        diff = np.max(np.abs(np.asarray(trained[path].get_value()) - np.asarray(value.get_value())))
        assert diff < 1e-7, (path, diff)
    far = max(np.max(np.abs(np.asarray(random_init[p].get_value()) - np.asarray(v.get_value())))
              for p, v in loaded.items())
    assert far > 1e-2


def test_sft_schedule_cosine_decays_the_warm_start_learning_rate_to_zero():
    """`SFTSpec.optimizer`: the warm start's learning rate follows its ``schedule``: linear
    warmup to the peak, then constant, or cosine to 0 at ``steps`` (values of
    `learners.optim.make_schedule` at hand-computed steps)."""
    from experiments.run.config import SFTSpec
    from learners.optim import make_schedule

    const = make_schedule(SFTSpec(steps=100, learning_rate=1e-3, warmup_steps=10).optimizer())
    cos = make_schedule(SFTSpec(steps=100, learning_rate=1e-3, warmup_steps=10,
                                schedule="cosine").optimizer())
    assert [float(const(s)) for s in (5, 10, 55, 100)] == pytest.approx([5e-4, 1e-3, 1e-3, 1e-3])
    # cosine over the 90 steps after warmup: at step 55 half-way, 0.5 * (1 + cos(pi/2))
    assert [float(cos(s)) for s in (5, 10, 55, 100)] == pytest.approx(
        [5e-4, 1e-3, 5e-4, 0.0], abs=1e-9)


def test_sampler_replicas_sample_the_tokens_of_one_device(reference, small_model_dir, tmp_path):
    """``sampler.num_devices=-1`` spreads the rollouts over every local device (8 here: the
    6 rows of a step in 6 device batches): the samples of the starting weights are the
    single-device run's token for token (same weights, same seeds), and every other
    figure agrees to float rounding (log-probs from other batch shapes)."""
    ref_dir, ref_job, _ = reference
    job, _ = run(small_config(small_model_dir, tmp_path / "replicas",
                              sampler=dataclasses.replace(QUICKSTART.sampler, num_devices=-1)))
    assert job.parts.sampler.config.num_devices == len(jax.local_devices()) == 8
    assert ref_job.parts.sampler.config.num_devices == 1
    too_many = small_config(small_model_dir, tmp_path / "never",
                            sampler=dataclasses.replace(QUICKSTART.sampler, num_devices=9))
    with pytest.raises(ConfigError, match=r"^sampler.num_devices=9 but this process has 8 "
                                          r"local cpu device\(s\) \(on CPU, start"):
        check_devices(too_many)
    ref, rep = metrics(ref_dir), metrics(tmp_path / "replicas")
    assert [r["step"] for r in ref] == [r["step"] for r in rep]
    tokens = [k for k in ref[0] if k.startswith(("reward/", "response/", "batch/num_loss_tokens"))]
    assert len(tokens) == 8
    first = [i for i, r in enumerate(ref) if r["batch/generation_version"] == 0]
    assert first == [0, 1]  # inter_lag 1: two batches of the starting weights
    for i in first:
        for key in tokens:
            assert ref[i][key] == rep[i][key], (i, key)
    for a, b in zip(ref, rep):
        for key, value in a.items():
            if isinstance(value, float) and not key.startswith("time/"):
                assert b[key] == pytest.approx(value, rel=1e-4, abs=1e-5), (a["step"], key)
