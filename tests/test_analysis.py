"""experiments.analysis: hand-computed goldens on synthetic run directories and arrays,
plus consistency checks on the stored real runs (tests/data/runs)."""

import json
import math
import pathlib

import numpy as np
import pytest

from experiments import analysis as A

DATA = pathlib.Path(__file__).parent / "data" / "runs"


def _config(name="entr", mode="simulated", inter=2, intra=1, seed=0, rl_steps=4):
    return {"seed": seed, "rl_steps": rl_steps,
            "objective": {"name": name, "entr": {"tau": 1.0, "eps": 0.01},
                          "icepop": {"alpha": 0.5, "beta": 5.0}, "kpop": {"phi": 2.0}},
            "staleness": {"mode": mode, "inter_lag": inter, "intra_switches": intra}}


def _write_run(path, config, rewards, inter=None, intra=None, times=None, evals=None):
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    inter = inter or [0.0] * len(rewards)
    intra = intra or [0.0] * len(rewards)
    with open(path / "metrics.jsonl", "w") as f:
        for n in reversed(range(len(rewards))):  # out of order on purpose: the loader sorts
            f.write(json.dumps({"step": n, "version": n, "reward/mean": rewards[n],
                                "staleness/inter_mean": inter[n], "staleness/intra_mean": intra[n],
                                "mask/fraction": 0.1 * n}) + "\n")
    times = times or [(1.0, 2.0, 0.5)] * len(rewards)
    with open(path / "timing.jsonl", "w") as f:
        for n, (s, l, w) in enumerate(times):
            f.write(json.dumps({"step": n, "time/sample_s": s, "time/learn_s": l, "time/wait_s": w}) + "\n")
    for phase, acc in (evals or {}).items():
        (path / "eval").mkdir(exist_ok=True)
        (path / "eval" / f"{phase}.json").write_text(json.dumps(
            {"phase": phase, "benchmarks": {"arithmetic": {"avg@n": acc, "greedy": acc}}}))


@pytest.fixture
def run_dir(tmp_path):
    p = tmp_path / "sweep" / "a"
    _write_run(p, _config(inter=2), [0.0, 0.5, 1.0, 0.25], inter=[0, 1, 2, 2], intra=[0, 1, 1, 3],
               times=[(1.0, 2.0, 0.0), (0.5, 1.5, 0.25), (1.0, 1.0, 0.0), (2.0, 2.0, 0.0)],
               evals={"before_rl": 0.25, "after_rl": 0.75})
    return p


def test_load_run_reads_every_file_and_sorts_steps(run_dir):
    r = A.load_run(run_dir)
    assert [m["step"] for m in r.metrics] == [0, 1, 2, 3]
    assert r.method == "entr" and r.inter_lag == 2 and r.intra_switches == 1 and r.seed == 0
    assert r.summary is None and sorted(r.evals) == ["after_rl", "before_rl"]


def test_load_runs_finds_nested_dirs_and_errors_name_the_path(run_dir, tmp_path):
    _write_run(tmp_path / "sweep" / "b" / "deep", _config(name="grpo", mode="sync"), [1.0])
    runs = A.load_runs(tmp_path / "sweep")
    assert [r.path.name for r in runs] == ["a", "deep"]
    assert runs[1].method == "grpo sync" and runs[1].inter_lag == 0 and runs[1].intra_switches == 0
    assert list(A.by_method(runs)) == ["entr", "grpo sync"]
    with pytest.raises(FileNotFoundError, match="no run directories"):
        A.load_runs(tmp_path / "sweep" / "a" / "eval")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        A.load_run(tmp_path)


def test_curves_against_step_and_wall_clock(run_dir):
    r = A.load_run(run_dir)
    x, y = A.curve(r, "reward/mean")
    np.testing.assert_array_equal(x, [0, 1, 2, 3])
    np.testing.assert_array_equal(y, [0.0, 0.5, 1.0, 0.25])
    # cumulative sample + learn + wait: 3, 3 + 2.25, 5.25 + 2, 7.25 + 4
    x, y = A.curve(r, "reward/mean", x="wall")
    np.testing.assert_allclose(x, [3.0, 5.25, 7.25, 11.25])
    with pytest.raises(KeyError, match="nope"):
        A.curve(r, "nope")
    with pytest.raises(ValueError, match="x must be"):
        A.curve(r, "reward/mean", x="time")
    ev = A.eval_points(r)
    assert ev == {"step": [0.0, 4.0], "wall": [0.0, 11.25], "value": [0.25, 0.75]}
    # async: sampling overlaps learning, only learn + wait count: 2, 3.75, 4.75, 6.75
    cfg = dict(r.config, staleness=dict(r.config["staleness"], mode="async"))
    x, _ = A.curve(A.Run(r.path, cfg, r.metrics, r.timing, None, {}), "reward/mean", x="wall")
    np.testing.assert_allclose(x, [2.0, 3.75, 4.75, 6.75])


def test_moving_average_is_trailing():
    np.testing.assert_allclose(A.moving_average(np.array([1.0, 3.0, 5.0, 7.0]), 2), [1.0, 2.0, 4.0, 6.0])
    with pytest.raises(ValueError, match="window"):
        A.moving_average(np.ones(3), 0)


def test_final_reward_and_measured_staleness(run_dir):
    r = A.load_run(run_dir)
    assert A.final_reward(r, window=2) == pytest.approx((1.0 + 0.25) / 2)
    assert A.final_reward(r, window=10) == pytest.approx(1.75 / 4)
    # steps >= inter lag 2 + intra switches 1 = 3: inter 2, intra 3
    assert A.measured_staleness(r) == (2.0, 3.0)
    assert A.measured_staleness(r, skip=2) == (2.0, 2.0)
    assert A.measured_staleness(r, skip=0) == (1.25, 1.25)


def test_sweep_rows_and_staleness_axis(tmp_path):
    root = tmp_path / "sw"
    spec = [("entr", 1, 1, 0, [0.0, 1.0]), ("entr", 1, 1, 1, [0.0, 0.5]), ("entr", 5, 1, 0, [0.0, 0.2]),
            ("entr", 1, 5, 0, [0.0, 0.4]), ("grpo", 5, 1, 0, [0.0, 0.0])]
    for i, (name, inter, intra, seed, rewards) in enumerate(spec):
        _write_run(root / f"r{i}", _config(name, inter=inter, intra=intra, seed=seed), rewards)
    _write_run(root / "sync", _config("grpo", mode="sync"), [0.0, 0.9])
    rows = A.sweep_rows(A.load_runs(root), window=1)
    assert len(rows) == 6 and {r["method"] for r in rows} == {"entr", "grpo", "grpo sync"}
    axis = A.staleness_axis(rows, "inter_lag")
    assert sorted(axis) == ["entr", "grpo"]
    x, mean, std = axis["entr"]
    np.testing.assert_array_equal(x, [1, 5])
    np.testing.assert_allclose(mean, [0.75, 0.2])  # seeds 0 and 1 averaged at lag 1
    np.testing.assert_allclose(std, [0.25, 0.0])
    x, mean, _ = A.staleness_axis(rows, "intra_switches")["entr"]
    np.testing.assert_array_equal(x, [1, 5])
    np.testing.assert_allclose(mean, [0.75, 0.4])
    with pytest.raises(ValueError, match="axis"):
        A.staleness_axis(rows, "lag")



def test_runs_of_different_lengths_are_not_pooled_into_one_point(tmp_path):
    """staleness_sweep.png used to pool 30- and 100-step runs into one point."""
    root = tmp_path / "sw"
    for i, (steps, seed, rewards) in enumerate([(2, 0, [0.0, 1.0]), (2, 1, [0.0, 0.5]),
                                                (4, 0, [0.0, 0.0, 0.0, 0.2])]):
        _write_run(root / f"r{i}", dict(_config("entr", inter=1, intra=1, seed=seed),
                                        rl_steps=steps), rewards)
    rows = A.sweep_rows(A.load_runs(root), window=1)
    assert sorted(r["rl_steps"] for r in rows) == [2, 2, 4]
    axis = A.staleness_axis(rows, "inter_lag")
    assert sorted(axis) == ["entr, 2 steps", "entr, 4 steps"]
    np.testing.assert_allclose(axis["entr, 2 steps"][1], [0.75])
    np.testing.assert_allclose(axis["entr, 4 steps"][1], [0.2])


def test_a_comparison_sweeps_runs_carry_its_method_names(tmp_path):
    """Figures used to call the sweep's grpo_async runs 'grpo'."""
    _write_run(tmp_path / "method=grpo_async_seed=0", dict(_config("grpo", mode="async"),
                                                          name="grpo_async"), [0.5])
    _write_run(tmp_path / "plain", dict(_config("grpo", mode="sync"), name="grpo_async"), [0.5])
    runs = A.load_runs(tmp_path)
    assert [r.method for r in runs] == ["grpo_async", "grpo sync"]
    assert [r["sync"] for r in A.sweep_rows(runs, window=1)] == [False, True]


def test_save_figure_respects_env(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure()
    monkeypatch.delenv(A.FIGURES_ENV, raising=False)
    assert A.save_figure(fig, "x") is None
    monkeypatch.setenv(A.FIGURES_ENV, str(tmp_path / "figs"))
    path = A.save_figure(fig, "x")
    assert path == tmp_path / "figs" / "x.png" and path.read_bytes()[:4] == b"\x89PNG"
    # relative: from the repository root, whatever the working directory (a notebook
    # kernel runs in notebooks/), as ENTR_RUNS is
    monkeypatch.setattr("experiments.analysis.runs.REPO_ROOT", tmp_path / "repo")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(A.FIGURES_ENV, "docs/figures")
    assert A.save_figure(fig, "x") == tmp_path / "repo" / "docs" / "figures" / "x.png"
    assert (tmp_path / "repo" / "docs" / "figures" / "x.png").is_file()
    monkeypatch.undo()  # the runs_root checks below read the real repository root
    monkeypatch.chdir(DATA.parents[2])
    plt.close(fig)
    monkeypatch.setenv(A.RUNS_ENV, str(tmp_path))
    assert A.runs_root("runs/other") == tmp_path
    monkeypatch.setenv(A.RUNS_ENV, "tests/data/runs")  # relative: from the repository root
    assert A.runs_root("runs/other") == DATA
    monkeypatch.delenv(A.RUNS_ENV)
    assert A.runs_root("runs/other") == DATA.parents[2] / "runs" / "other"


# --------------------------------------------------------------------------- tokens
def test_bin_by_entropy_hand_computed():
    h = np.array([0.05, 0.2, 0.3, 0.7, 2.5, 3.0, -0.1])
    d = np.array([0.1, 1.0, -3.0, 2.0, 0.5, -0.5, 9.0])
    b = A.bin_by_entropy(d, h, [0.0, 0.1, 0.5, 1.0])
    np.testing.assert_array_equal(b["count"], [1, 2, 1, 2])  # -0.1 is below the first edge
    np.testing.assert_allclose(b["delta_sq_mean"], [0.01, 5.0, 4.0, 0.25])
    np.testing.assert_allclose(b["entropy_mean"], [0.05, 0.25, 0.7, 2.75])
    # d^2 in bin 1 = {1, 9}: sample std = sqrt(16 + 16), sem = sqrt(32)/sqrt(2) = 4
    np.testing.assert_allclose(b["delta_sq_sem"], [np.nan, 4.0, np.nan, 0.0])
    with pytest.raises(ValueError, match="increasing"):
        A.bin_by_entropy(d, h, [0.0, 0.0, 1.0])


def test_quantile_edges():
    np.testing.assert_allclose(A.quantile_edges(np.array([0.5, 1.0, 2.0, 3.0]), 2), [0.0, 1.5])
    np.testing.assert_allclose(A.quantile_edges(np.array([1.0, 1.0, 1.0]), 3), [0.0, 1.0])


def test_wls_fit_exact_line_and_hand_computed_standard_error():
    x = np.array([0.0, 1.0, 2.0, 4.0])
    fit = A.wls_fit(x, 2.0 * x + 1.0, np.array([1.0, 3.0, 2.0, 5.0]))
    assert (fit.slope, fit.intercept) == pytest.approx((2.0, 1.0))
    assert fit.slope_se == pytest.approx(0.0, abs=1e-12) and fit.dof == 2
    # y = (0, 1, 3) at x = (0, 1, 2): slope 3/2, intercept -1/6, SSR 1/6, s^2 = 1/6,
    # se(slope) = sqrt(s^2 / Sxx) = sqrt(1/12)
    fit = A.wls_fit([0, 1, 2], [0, 1, 3], [1, 1, 1])
    assert fit.slope == pytest.approx(1.5) and fit.intercept == pytest.approx(-1 / 6)
    assert fit.slope_se == pytest.approx(math.sqrt(1 / 12))
    # through the origin: slope = sum(w x y) / sum(w x^2) = (1 + 6) / (1 + 4) = 1.4
    fit = A.wls_fit([1, 2, 3], [1, 3, 100], [1, 1, 0], intercept=False)
    assert fit.slope == pytest.approx(1.4) and math.isnan(fit.intercept_se)
    with pytest.raises(ValueError, match="usable points"):
        A.wls_fit([1.0], [1.0], [1.0])


def test_wls_fit_matches_numpy_polyfit_with_weights():
    rng = np.random.default_rng(0)
    x, w = rng.uniform(0, 3, 9), rng.integers(1, 20, 9).astype(float)
    y = 0.3 * x + 0.05 + rng.normal(0, 0.1, 9)
    coef, cov = np.polyfit(x, y, 1, w=np.sqrt(w), cov=True)  # numpy weights multiply residuals
    fit = A.wls_fit(x, y, w)
    np.testing.assert_allclose([fit.slope, fit.intercept], coef, rtol=1e-10)
    np.testing.assert_allclose([fit.slope_se, fit.intercept_se], np.sqrt(np.diag(cov)), rtol=1e-8)


def _tokens(delta, h, logp_mu, logp_pi=None):
    delta, logp_mu = np.asarray(delta, float), np.asarray(logp_mu, float)
    logp_pi = logp_mu + delta if logp_pi is None else np.asarray(logp_pi, float)
    n = len(delta)
    return A.Tokens(delta, np.asarray(h, float), np.zeros(n), logp_mu, logp_pi,
                    np.zeros(n, np.int64), np.zeros(n))


def test_fit_bins_and_bootstrap_recover_the_slope():
    # delta^2 = 0.5 H exactly in every token (delta = +-sqrt(0.5 H)): slope 0.5, se 0
    h = np.repeat([0.2, 0.6, 1.4, 2.8], 5)
    d = np.sqrt(0.5 * h) * np.where(np.arange(20) % 2, 1, -1)
    edges = [0.0, 0.5, 1.0, 2.0]
    fit = A.fit_bins(A.bin_by_entropy(d, h, edges))
    assert fit.slope == pytest.approx(0.5) and fit.intercept == pytest.approx(0.0, abs=1e-12)
    slopes = A.bootstrap_slope(d, h, edges, n_boot=20, seed=1)
    np.testing.assert_allclose(slopes[np.isfinite(slopes)], 0.5)
    assert np.isfinite(slopes).sum() >= 15


def test_off_mode_outliers():
    t = _tokens(delta=[0.6, -0.6, 0.01, 0.01, 2.0],
                h=[0.05, 0.05, 0.05, 0.05, 1.0],
                logp_mu=[-0.01, -0.01, -3.0, -0.02, -5.0])
    np.testing.assert_array_equal(A.off_mode_outliers(t), [True, True, True, False, False])
    np.testing.assert_array_equal(A.off_mode_outliers(t, abs_delta_min=1.0),
                                  [False, False, True, False, False])
    assert A.LOW_ENTROPY_NATS == pytest.approx(-0.02 * math.log(0.02) - 0.98 * math.log(0.98), abs=1e-3)


def test_gate_decisions_hand_computed():
    # ENTR tau=1, eps=0.01: band sqrt(H + 0.01); IcePop [log .5, log 5] = [-0.693, 1.609]
    t = _tokens(delta=[0.05, 0.2, 0.9, -0.8, 1.7, 0.0],
                h=[0.0, 0.0, 1.0, 1.0, 3.0, 0.5],
                logp_mu=[-0.2, -0.3, -2.0, -0.5, -4.0, -1e-3])
    keep = A.gate_decisions(t, A.gate_params(_config()))
    np.testing.assert_array_equal(keep["entr"], [True, False, True, True, True, True])
    np.testing.assert_array_equal(keep["icepop"], [True, True, True, False, False, True])
    # KPop phi=2: binary KL of tiny changes is tiny; p=exp(-0.5)=.607 -> exp(-1.3)=.273:
    # D(q||p) = .607 ln(.607/.273) + .393 ln(.393/.727) = 0.485 - 0.242 < 2 -> kept
    np.testing.assert_array_equal(keep["kpop"], [True] * 6)
    # phi = 0.1. Token 0: mu = e^-6 -> pi = e^-1: all three cut. Token 1: mu = .951 ->
    # pi = .577: D(q||p) = .951 ln(.951/.577) + .049 ln(.049/.423) = 0.369 > 0.1, so KPop
    # cuts what IcePop (e^-.5 = .61 >= .5) and ENTR (.5 <= sqrt(1.01)) keep.
    keep = A.gate_decisions(_tokens([5.0, -0.5], [1.0, 1.0], [-6.0, -0.05]),
                            {"entr": {"tau": 1, "eps": 0.01}, "icepop": {"alpha": .5, "beta": 5},
                             "kpop": {"phi": 0.1}})
    np.testing.assert_array_equal(keep["kpop"], [False, False])
    np.testing.assert_array_equal(keep["icepop"], [False, True])
    np.testing.assert_array_equal(keep["entr"], [False, True])


def test_bands():
    np.testing.assert_allclose(A.entr_band(np.array([0.0, 0.99, -1.0]), 4.0, 0.01), [0.2, 2.0, 0.2])
    assert A.icepop_band(0.5, 5.0) == pytest.approx((math.log(0.5), math.log(5.0)))
    grid = np.linspace(-3, 3, 61)
    lo, hi = A.kpop_band(np.array([-1e-4, -2.0]), 0.05, grid)
    # near-certain token (q = .9999): delta = +0.1 puts p at 1 (D(q||p) = inf) and
    # delta = -0.1 costs D(p||q) = .905 ln(.905/.9999) + .095 ln(.095/1e-4) = 0.56: only
    # delta = 0 of the grid is kept
    assert lo[0] == pytest.approx(0.0, abs=1e-9) and hi[0] == pytest.approx(0.0, abs=1e-9)
    assert lo[1] < -0.1 and hi[1] > 0.1


def test_cut_fraction_by_bin():
    frac = A.cut_fraction_by_bin(np.array([0.05, 0.05, 0.3, 2.0]), np.array([True, False, False, True]),
                                 [0.0, 0.1, 1.0, 5.0])
    np.testing.assert_allclose(frac, [0.5, 1.0, 0.0, np.nan])


# --------------------------------------------------------------------------- stored real runs
@pytest.fixture(scope="module")
def stored():
    return A.load_runs(DATA)


def test_stored_runs_token_bins_match_the_learner_metrics(stored):
    """Binning the stored token samples at step n reproduces the learner's own
    ratio_by_entropy metrics of step n (same tokens, same buckets)."""
    from entr_jax.metrics import ENTROPY_BUCKET_EDGES

    checked = 0
    for run in stored:
        tok = A.load_tokens(run)
        for n in np.unique(tok.step):
            t = tok.select(tok.step == n)
            mine = A.bin_by_entropy(t.delta, t.entropy_mu, ENTROPY_BUCKET_EDGES)
            theirs = A.metric_buckets(run, steps=[int(n)])
            np.testing.assert_array_equal(mine["count"], theirs["count"])
            np.testing.assert_allclose(mine["entropy_mean"], theirs["entropy_mean"], rtol=1e-5)
            np.testing.assert_allclose(mine["delta_sq_mean"], theirs["delta_sq_mean"], rtol=0.05, atol=1e-10)
            checked += 1
    assert checked >= 4


def test_stored_runs_measured_staleness_matches_config(stored):
    """After warm-up every trajectory's oldest token is inter_lag + intra_switches versions
    behind (simulated mode), so the measured inter + intra equals the configured sum."""
    for run in stored:
        inter, intra = A.measured_staleness(run)
        assert inter + intra == pytest.approx(run.inter_lag + run.intra_switches), run.path
        assert inter >= run.inter_lag
        tok = A.load_tokens(run)
        assert np.nanmax(tok.staleness) <= run.inter_lag + run.intra_switches, run.path
        assert np.nanmin(tok.staleness) >= 0


def test_sweep_specs_expand_to_valid_configs():
    """The stored sweep specs expand to the documented grids and every run's command line
    parses into a valid RunConfig."""
    import shlex

    from entr_jax.objectives import OBJECTIVES
    from experiments.run import cli
    from experiments.run.configs import QUICKSTART
    from experiments.multirun import sweep

    sweeps = pathlib.Path(__file__).resolve().parents[1] / "experiments" / "sweeps"
    got = {}
    for name, count in (("cpu_staleness", 4 * (5 + 4 - 1) + 1), ("cpu_methods", len(OBJECTIVES) - 1 + 1)):
        spec = sweep.load_spec(sweeps / f"{name}.toml")
        cfgs = [cli.parse(shlex.split(line)[3:])[0] for line in sweep.emit(spec, "/tmp/unused")]
        assert len(cfgs) == count, name
        got[name] = cfgs
    points = {(c.objective.name, c.staleness.mode, c.staleness.inter_lag, c.staleness.intra_switches)
              for c in got["cpu_staleness"]}
    for m in ("grpo", "icepop", "kpop", "entr"):
        assert {(m, "simulated", k, 1) for k in (1, 5, 15, 20, 30)} <= points
        assert {(m, "simulated", 1, d) for d in (1, 5, 7, 9)} <= points
    assert ("grpo", "sync") in {(p[0], p[1]) for p in points}
    assert all(c.staleness.ring_size >= 10 for c in got["cpu_staleness"])
    assert all(c.staleness.switch_window >= 10 for c in got["cpu_staleness"]
               if c.staleness.mode == "simulated")
    # [fixed] simulated-only fields are not passed to the sync runs (the CLI refuses them)
    sync = [c for c in got["cpu_methods"] if c.staleness.mode == "sync"]
    assert len(sync) == 1 and sync[0].staleness.inter_lag == QUICKSTART.staleness.inter_lag
    assert all(c.staleness.inter_lag == 5 for c in got["cpu_methods"] if c.staleness.mode == "simulated")
    assert {c.objective.name for c in got["cpu_methods"]} == set(OBJECTIVES) - {"estr"}


# --------------------------------------------------------------------------- across seeds
def test_mean_ci_and_paired_gap_hand_computed():
    # [1, 2, 3]: mean 2, s = 1, t(0.975, 2) = 4.302653 -> half width 4.302653 / sqrt(3)
    m, half, n = A.mean_ci([1.0, 2.0, 3.0, float("nan")])
    assert (m, n) == (2.0, 3) and half == pytest.approx(2.484138, abs=1e-6)
    assert A.mean_ci([0.5])[0] == 0.5 and math.isnan(A.mean_ci([0.5])[1])
    rows = [{"method": "grpo", "seed": s, "v": v} for s, v in ((0, 0.5), (1, 0.7), (2, 0.6))]
    rows += [{"method": "grpo sync", "seed": s, "v": v} for s, v in ((0, 0.6), (1, 0.9), (2, 0.9), (3, 1.0))]
    gap, half, n = A.paired_gap(rows, "grpo", "grpo sync", "v")  # diffs -0.1, -0.2, -0.3 (seed 3 unpaired)
    assert n == 3 and gap == pytest.approx(-0.2) and half == pytest.approx(0.248414, abs=1e-6)
    assert not A.excludes_zero(gap, half) and A.excludes_zero(-0.3, 0.2)
    table = A.method_table(rows, "v")
    assert table["grpo sync"][0] == pytest.approx(0.85) and table["grpo sync"][2] == 4
    with pytest.raises(ValueError, match="seed 0 twice"):
        A.paired_gap(rows + rows[:1], "grpo", "grpo sync", "v")
