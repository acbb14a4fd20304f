"""The split of every log-ratio into mismatch and staleness (`experiments.run.decomposition`,
`experiments.analysis.decompose`): exact on a planted mismatch, zero staleness at lag 0,
zero mismatch with a float32 sampler, and the parts adding up to the whole."""

import dataclasses
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from entr_jax.interfaces import SamplingParams
from entr_jax.model import from_pretrained
from entr_jax.staleness import ParamRing, StalenessConfig
from entr_jax.types import Trajectory
from experiments.analysis import decompose, decompose_tables
from experiments.analysis.runs import load_run
from experiments.run.config import SamplerSpec
from experiments.run.decomposition import logp_at_token_version
from learners.learner import Learner, LearnerConfig
from learners.optim import OptimizerConfig
from samplers.jax_sampler import JaxSampler, JaxSamplerConfig
from tests.small_job import run, small_config, synthetic

PLANT = 0.5  # the sampler's logits are (1 + PLANT) x the learner's: temperature 1 / 1.5


def _planted(state, c):
    """The weights with the final norm's scale times (1 + c): every logit times (1 + c)
    (the LM head is linear in the normed hidden state)."""
    return jax.tree_util.tree_map_with_path(
        lambda p, x: x * (1 + c) if "final_norm" in jax.tree_util.keystr(p) else x, state)


def test_a_planted_mismatch_of_known_size_is_recovered(small_model_dir):
    """The sampler serves version v's weights with every logit scaled by 1.5, switching from
    version 0 to version 1 at decode step 2; each token's delta_mis must equal
    log softmax(z)[y] - log softmax(1.5 z)[y] of the learner's own logits z at the token's
    version, and the tokens of each version must be scored with that version's weights."""
    model = from_pretrained(small_model_dir)
    learner = Learner(lambda: from_pretrained(small_model_dir),
                      LearnerConfig(optimizer=OptimizerConfig(learning_rate=1e-3), pad_id=3,
                                    logprob_chunk=8))
    w0 = learner.published_weights()
    w1 = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(jax.random.key(1), x.shape, x.dtype), w0)
    ring = ParamRing(2)
    ring.push(0, w0)
    ring.push(1, w1)
    sampler = JaxSampler(nnx.merge(nnx.split(model)[0], _planted(w0, PLANT)), version=0,
                         config=JaxSamplerConfig(max_batch_size=8))
    params = SamplingParams(temperature=1.0, max_new_tokens=6, stop_token_ids=(), seed=3)
    gens = sampler.generate([[5, 6, 7], [8, 9]], params, num_samples=3,
                            weight_schedule=[(2, _planted(w1, PLANT), 1)])
    trajs = [Trajectory.from_generation(g) for samples in gens for g in samples]
    assert {int(v) for t in trajs for v in t.token_version} == {0, 1}

    logp_version = logp_at_token_version(learner, trajs, ring, [0, 1])
    arrays = learner.token_logprobs(trajs)
    mask = arrays["loss_mask"].astype(bool)
    delta_mis = (logp_version - arrays["logp_mu"])[mask]

    expected = np.zeros_like(logp_version)
    for v, w in ((0, w0), (1, w1)):
        net = nnx.merge(nnx.split(model)[0], w)
        for b, t in enumerate(trajs):
            ids = np.concatenate([t.prompt_ids, t.response_ids])[None]
            z = net(jnp.asarray(ids))[0, len(t.prompt_ids) - 1:-1]  # predicts each response token
            y = t.response_ids
            lp = jax.nn.log_softmax(z)[np.arange(len(y)), y]
            lq = jax.nn.log_softmax((1 + PLANT) * z)[np.arange(len(y)), y]
            p = len(t.prompt_ids) - 1
            here = t.token_version == v
            expected[b, p:p + len(y)][here] = np.asarray(lp - lq)[here]
    np.testing.assert_allclose(delta_mis, expected[mask], atol=2e-5)
    assert np.mean(expected[mask] ** 2) > 1e-3  # the plant is far above the tolerance


def test_tokens_of_a_version_outside_the_batch_plan_are_refused(small_model_dir):
    learner = Learner(lambda: from_pretrained(small_model_dir),
                      LearnerConfig(optimizer=OptimizerConfig(), pad_id=3, logprob_chunk=8))
    ring = ParamRing(1)
    ring.push(0, learner.published_weights())
    t = Trajectory(prompt_ids=np.array([5], np.int32), response_ids=np.array([6, 7], np.int32),
                   logp_mu=np.zeros(2, np.float32), entropy_mu=np.zeros(2, np.float32),
                   token_version=np.array([0, 4], np.int32), loss_mask=np.ones(2, bool))
    with pytest.raises(ValueError, match=r"versions \[4\] are not among"):
        logp_at_token_version(learner, [t], ring, [0])


@pytest.fixture(scope="module")
def decomposed_runs(small_model_dir, tmp_path_factory):
    """Three short runs with token samples every step: sync with the float32 sampler,
    simulated staleness (inter lag 1, two in-flight switches) with the float32 sampler,
    and the same with int8 sampler weights."""
    root = tmp_path_factory.mktemp("decomposed")
    stale = StalenessConfig(mode="simulated", inter_lag=1, intra_switches=2, switch_window=3,
                            ring_size=3)
    cfgs = {
        "sync": dict(staleness=StalenessConfig(mode="sync")),
        "stale": dict(staleness=stale),
        "stale_int8": dict(staleness=stale, sampler=SamplerSpec(weight_quant="int8")),
    }
    out = {"dirs": {}}
    for name, changes in cfgs.items():
        cfg = small_config(small_model_dir, root / name, rl_steps=4, token_samples_every=1,
                           **changes)
        cfg = dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, learning_rate=3e-3))
        run(cfg, advantages=synthetic)  # the policy moves
        out[name] = decompose.load_run(load_run(root / name))[0]
        out["dirs"][name] = root / name
    return out


def test_at_lag_zero_the_staleness_part_is_exactly_zero(decomposed_runs):
    t = decomposed_runs["sync"]
    assert len(t) > 20 and np.all(t.age == 0)
    assert np.all(t.delta_stale == 0.0)


def test_a_float32_sampler_has_no_mismatch_and_the_parts_add_up(decomposed_runs):
    for name in ("sync", "stale"):
        t = decomposed_runs[name]
        assert np.max(np.abs(t.delta_mis)) <= 1e-5, name
        np.testing.assert_allclose(t.delta_mis + t.delta_stale, t.delta, atol=1e-6)
    t = decomposed_runs["stale"]
    old = t.age > 0
    assert old.sum() > 10 and np.mean(np.abs(t.delta_stale[old]) > 1e-4) > 0.5
    assert np.all(t.age >= 0) and t.age.max() >= 2  # inter lag 1 + in-flight switches


def test_int8_sampler_weights_are_a_mismatch_the_decomposition_sees(decomposed_runs):
    t = decomposed_runs["stale_int8"]
    np.testing.assert_allclose(t.delta_mis + t.delta_stale, t.delta, atol=1e-6)
    f32 = decomposed_runs["stale"]
    # far above the float32 sampler's (a random-init small model: int8 gives ~3e-4 here)
    rms = np.sqrt(np.mean(t.delta_mis ** 2))
    assert rms > 1e-4 and rms > 20 * np.max(np.abs(f32.delta_mis))
    # the same seed and staleness: the stale part is drift of comparable size in both runs
    ratio = np.mean(t.delta_stale ** 2) / np.mean(f32.delta_stale ** 2)
    assert 0.1 < ratio < 10


def test_the_cli_writes_the_table_and_the_report(decomposed_runs, tmp_path):
    dirs = [decomposed_runs["dirs"][n] for n in ("stale", "stale_int8")]
    out = tmp_path / "out"
    assert decompose.main([*map(str, dirs), "--out", str(out), "--n-boot", "20"]) == 0
    report = json.loads((out / "decomposition.json").read_text())
    z = np.load(out / "tokens.npz")
    n = sum(len(decomposed_runs[k]) for k in ("stale", "stale_int8"))
    assert report["tokens"] == len(z["delta"]) == n
    assert sorted(set(z["run"].tolist())) == [0, 1]
    # two runs: steps resampled within each run (a run bootstrap of two runs means nothing)
    assert report["bootstrap"]["unit"] == "step" and report["bootstrap"]["runs"] == 2
    assert report["max_abs_sum_error"] <= 1e-6
    assert set(report["gates"]["overall"]) == {"entr", "icepop", "kpop", "trm", "m2po", "tis"}
    np.testing.assert_allclose(z["q"], np.exp(z["logp_mu"]))


def test_a_run_without_the_decomposition_is_refused_with_the_fix(tmp_path, small_model_dir):
    run(small_config(small_model_dir, tmp_path / "async", rl_steps=2, token_samples_every=1,
                     staleness=StalenessConfig(mode="async", max_staleness=1, intra_switches=0,
                                               ring_size=1)))
    with pytest.raises(ValueError, match="rerun it in sync or simulated"):
        decompose.load_run(load_run(tmp_path / "async"))


def test_the_stored_study_slice_decomposes(tmp_path):
    """The CI slice of the fp8 study (tests/data/study_slice, tests/data/make_study_slice.sh:
    stale runs with fp8 sampler weights): both parts are present and add up."""
    root = pathlib.Path(__file__).parent / "data" / "study_slice"
    out = tmp_path / "out"
    assert decompose.main([str(root), "--out", str(out), "--n-boot", "10"]) == 0
    report = json.loads((out / "decomposition.json").read_text())
    z = np.load(out / "tokens.npz")
    assert report["bootstrap"]["unit"] == "step" and len(report["runs"]) == 2
    assert report["max_abs_sum_error"] <= 1e-6
    assert report["max_abs_delta_mis"] > 1e-3  # fp8 weights: a mismatch
    material = np.abs(z["delta"]) > decompose.MATERIAL_NATS
    mis = np.abs(z["delta_mis"]) > np.abs(z["delta_stale"])
    m = report["gates"]["material"]
    assert (m["mis"], m["stale"]) == (int((mis & material).sum()), int((~mis & material).sum()))
    assert set(decompose.gc.GATES) <= set(m) and 0.0 <= m["entr"]["auc"] <= 1.0
    old = z["age"] > 0
    assert old.sum() > 100 and np.mean(np.abs(z["delta_stale"][old]) > 1e-6) > 0.5  # drift
    assert np.all(z["delta_stale"][z["age"] == 0] == 0.0)


def test_the_cli_prints_the_numbers_the_docs_quote_and_refuses_bad_options(tmp_path, capsys):
    """The console names the off-mode exponent and the amplification beside k (the docs
    quote those), with rounded intervals; --by's table has a header cell per column; a --by
    field no run has and an --out that is a file are refused in one line."""
    root = pathlib.Path(__file__).parent / "data" / "study_slice"
    out = tmp_path / "out"
    assert decompose.main([str(root), "--out", str(out), "--n-boot", "10"]) == 0
    lines = capsys.readouterr().out.splitlines()
    r = json.loads((out / "decomposition.json").read_text())
    b, boot = r["premises"]["mis_vs_q"], r["bootstrap"]
    ci = lambda c: f"[{c[0]:.3g}, {c[1]:.3g}]"  # noqa: E731
    assert lines[1] == (f"E[delta^2] {r['delta_sq_mean']:.3g}: drift E[delta_stale^2] "
                        f"{r['delta_stale_sq_mean']:.3g}, mismatch E[delta_mis^2] "
                        f"{r['delta_mis_sq_mean']:.3g} (max |delta_mis| "
                        f"{r['max_abs_delta_mis']:.3g})")
    assert f"off-mode (q < 0.5) k = {b['exponent_off_mode']:.3g} " in lines[3]
    assert f"k = {b['exponent']:.3g} {ci(boot['exponent_ci95'])};" in lines[3]
    assert lines[2].endswith(f"{ci(boot['slope_ci95'])} (95% CIs: bootstrap over "
                             f"{decompose_tables.resampled(boot)})")
    assert decompose.main([str(root), "--out", str(tmp_path / "by"), "--n-boot", "4",
                           "--by", "objective.name"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert len(table) == 4 and {row.count("|") for row in table} == {table[0].count("|")}
    assert decompose.main([str(root), "--out", str(tmp_path / "x"), "--by", "objective.nme"]) == 2
    assert capsys.readouterr().err == ("decompose: --by objective.nme: no run's config.json has "
                                       "this field; give dotted config fields, e.g. "
                                       "sampler.weight_quant\n")
    (tmp_path / "file").write_text("")
    assert decompose.main([str(root), "--out", str(tmp_path / "file")]) == 2
    assert capsys.readouterr().err == (f"decompose: --out {tmp_path / 'file'} is a file: give a "
                                       "folder (made if missing)\n")


def _synthetic(n_runs: int, steps: int, per_step: int = 40) -> decompose.Decomposed:
    """Tokens with E[delta_stale^2 | H] = a_r H, where the slope a_r differs by run."""
    rng = np.random.default_rng(0)
    n = n_runs * steps * per_step
    run = np.repeat(np.arange(n_runs), steps * per_step)
    step = np.tile(np.repeat(np.arange(steps), per_step), n_runs)
    h = rng.uniform(0.0, 3.0, n)
    stale = rng.normal(size=n) * np.sqrt((1.0 + 0.5 * run) * h)
    mis = rng.normal(size=n) * 1e-3
    logp_mu = -rng.uniform(0.0, 3.0, n)
    z = np.zeros(n)
    return decompose.Decomposed(
        run=run, step=step, row=z.astype(np.int64), entropy_mu=h, entropy_pi=h,
        logp_mu=logp_mu, logp_pi=logp_mu + mis + stale, logp_version=logp_mu + mis,
        delta=mis + stale, delta_mis=mis, delta_stale=stale, age=np.ones(n, np.int64))


def test_the_bootstrap_resamples_runs_only_when_there_are_enough(monkeypatch):
    few = decompose.bootstrap(_synthetic(2, 6), n_boot=50)
    assert (few["unit"], few["runs"], few["units"]) == ("step", 2, 12)
    assert decompose_tables.resampled(few) == "12 steps within 2 runs"
    single = decompose.bootstrap(_synthetic(2, 1), n_boot=20)  # no steps to resample
    assert (single["unit"], single["units"]) == ("run", 2)
    five = _synthetic(decompose.MIN_RUNS_FOR_RUN_BOOTSTRAP, 6)
    many = decompose.bootstrap(five, n_boot=50)
    assert (many["unit"], many["units"]) == ("run", decompose.MIN_RUNS_FOR_RUN_BOOTSTRAP)
    assert decompose_tables.resampled(many) == "5 runs"
    # the runs' slopes differ (1.0 ... 3.0): resampling runs carries that spread, resampling
    # steps within runs cannot, so its interval is much narrower
    monkeypatch.setattr(decompose, "MIN_RUNS_FOR_RUN_BOOTSTRAP", 6)
    within = decompose.bootstrap(five, n_boot=50)
    assert within["unit"] == "step"
    width = lambda ci: ci[1] - ci[0]  # noqa: E731
    assert width(many["slope_ci95"]) > 2 * width(within["slope_ci95"])
