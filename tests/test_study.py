"""Pre-registered studies (`experiments.multirun.study`, `experiments.analysis.study_report`): the
stages' runs, the choice on tuning seeds, the paired report and its detectable difference."""

import json
import pathlib
import math

import pytest

from experiments.multirun import study as st
from experiments.multirun import study_archive
from experiments.analysis import study_report as sr

SPEC = """
preset = "stress"
[preregistration]
primary_metric = "eval_ref_logp_after"
secondary_metrics = ["eval_accuracy_after"]
baseline = "grpo_async"
arms = ["grpo_sync", "grpo_async", "entr"]
tuning_arms = ["grpo_async"]
tuning_seeds = [100, 101]
test_seeds = [0, 1, 2]
[[preregistration.warm_starts]]
name = "A"
path = "ws/a"
sha256 = "{a}"
[[preregistration.warm_starts]]
name = "B"
path = "ws/b"
sha256 = "{b}"
[tuning.entr]
own = [{{ tau = 1.0 }}, {{ tau = 4.0 }}]
[comparison]
base = {{ aggregation = "token_mean", l_norm = "None", clip_low = 0.2, clip_high = 0.28 }}
[comparison.methods.entr]
objective = "entr"
own = {{ tau = 1.0, eps = 0.01, entropy_source = "behavior_full", denominator = "all_tokens" }}
[comparison.methods.grpo_async]
objective = "grpo"
own = {{ kl_coef = 0.0 }}
[comparison.methods.grpo_sync]
objective = "grpo"
own = {{ kl_coef = 0.0 }}
overrides = {{ "staleness.mode" = "sync" }}
[fixed]
"sft.steps" = 0
rl_steps = 4
"""


@pytest.fixture
def study(tmp_path):
    path = tmp_path / "study.toml"
    path.write_text(SPEC.format(a="a" * 64, b="b" * 64))
    return st.load_study(path)


def test_the_tuning_stage_runs_every_candidate_on_the_tuning_seeds_per_warm_start(study, tmp_path):
    sweeps = st.stage_sweeps(study, "tune", tmp_path)
    assert [d.relative_to(tmp_path).as_posix() for _, d in sweeps] == ["tune/A", "tune/B"]
    spec, where = sweeps[0]
    runs = st.sweep.expand(spec, where)
    assert sorted(r.name for r in runs) == sorted(
        f"method={m}_seed={s}" for m in ("entr@0", "entr@1", "grpo_async") for s in (100, 101))
    r = next(r for r in runs if r.name == "method=entr@1_seed=100")
    assert r.overrides["objective.entr.tau"] == 4.0 and r.overrides["model.sha256"] == "a" * 64
    assert r.overrides["model.path"] == "ws/a" and r.overrides["seed"] == 100


def _finish(path, name, seed, metric, acc=0.5):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"name": name}))
    (path / "summary.json").write_text(json.dumps({"eval_ref_logp_after": metric,
                                                   "eval_accuracy_after": acc}))
    (path / "metrics.jsonl").write_text(json.dumps({"step": 0, "mask/fraction": 0.01}) + "\n")


def test_choose_takes_the_best_mean_on_tuning_runs_and_refuses_an_unfinished_stage(study, tmp_path):
    with pytest.raises(ValueError, match=r"no finished tuning runs under .*tune: run the tune stage"):
        st.choose(dict(study, preregistration={**study["preregistration"], "rule_arm": None}),
                  tmp_path)
    values = {"entr@0": [-1.0, -1.2, -1.1, -0.9], "entr@1": [-0.8, -1.0, -0.9, -1.1]}
    for (spec, where) in st.stage_sweeps(study, "tune", tmp_path):
        for run in st.sweep.expand(spec, where):
            label = run.name.split("_seed=")[0].removeprefix("method=")
            i = (where.name == "B") * 2 + (run.overrides["seed"] - 100)
            _finish(run.run_dir, label, run.overrides["seed"], values.get(label, [0] * 4)[i])
    choice = st.choose(study, tmp_path)
    assert choice["chosen"]["entr"] == {"own": {"tau": 4.0}, "index": 1, "mean": pytest.approx(-0.95)}
    assert [c["mean"] for c in choice["candidates"]["entr"]] == [pytest.approx(-1.05), pytest.approx(-0.95)]
    assert json.loads((tmp_path / "choice.json").read_text())["chosen"]["entr"]["index"] == 1
    test = st.stage_sweeps(study, "test", tmp_path, choice)
    runs = st.sweep.expand(*test[1])
    entr = next(r for r in runs if r.name == "method=entr_seed=2")
    assert entr.overrides["objective.entr.tau"] == 4.0 and entr.overrides["model.path"] == "ws/b"


def test_choose_lists_every_unfinished_tuning_run_the_baselines_too(study, tmp_path):
    """The rule's tau comes from the baseline's tuning runs: one of them missing is refused
    as an unfinished candidate is, and the message names each missing run."""
    for spec, where in st.stage_sweeps(study, "tune", tmp_path):
        for run in st.sweep.expand(spec, where):
            label = run.name.split("_seed=")[0].removeprefix("method=")
            if (label, where.name, run.overrides["seed"]) not in {("grpo_async", "B", 101),
                                                                  ("entr@1", "A", 100)}:
                _finish(run.run_dir, label, run.overrides["seed"], -1.0)
    no_rule = dict(study, preregistration={**study["preregistration"], "rule_arm": None})
    with pytest.raises(ValueError) as err:
        st.choose(no_rule, tmp_path)
    assert str(err.value) == (
        "choose: 2 of 12 tuning runs are unfinished (method: warm start/seed): entr@1: A/100; "
        "grpo_async: B/101; finish them with the tune stage on the same --out (finished runs "
        "are skipped)")
    assert not (tmp_path / "choice.json").exists()


@pytest.mark.parametrize("args, message", [
    (["plan", "{dir}"], "study spec {dir}: cannot be read (Is a directory): pass a study's .toml file"),
    (["plan", "{bad}"], "study spec {bad} is not TOML (Expected '=' after a key"),
    (["status", "{spec}", "--out", "{spec}"], "--out {spec} is a file: pass the study's folder"),
    (["status", "{spec}", "--out", "{dir}/nope"], "--out {dir}/nope holds no tune/ folder"),
    (["choose", "{spec}", "--out", "{dir}"], "--out {dir} holds no tune/ folder"),
    (["status", "{spec}", "--out", "{dir}", "--warm-start", "C"],
     "--warm-start applies to the tune/test stages, not status: drop it"),
    (["status", "{spec}", "--out", "{dir}", "--only", "entr"], "--only applies to the tune/test"),
    (["plan", "{spec}", "--to", "x"], "--to applies to the archive stage, not plan: drop it"),
    (["tune", "{spec}", "--out", "{dir}", "--workers", "0"], "--workers 0: give at least 1"),
    (["tune", "{spec}", "--out", "{dir}", "--warm-start", "C"],
     "--warm-start 'C': the study's warm starts are ['A', 'B']"),
    (["tune", "{spec}", "--out", "{dir}", "--only", "("], "--only '(' is not a regular expression"),
    (["report", "{spec}", "--out", "{dir}"], "{dir}/choice.json is missing: run the choose stage"),
    (["report", "{spec}", "--out", "{dir}/trunc"],
     "{dir}/trunc/choice.json is not JSON (Expecting value: line 1 column 1 (char 0)): rerun"),
    (["test", "{spec}", "--out", "{dir}/empty"], "{dir}/empty/choice.json lacks ['chosen']: "
     "it is not the choose stage's; rerun it"),
])
def test_bad_command_line_input_is_one_line_naming_the_fix(tmp_path, capsys, monkeypatch, args,
                                                           message):
    monkeypatch.setattr(st.sweep, "run_runs", lambda *a: pytest.fail("a run was started"))
    spec, bad = tmp_path / "study.toml", tmp_path / "bad.toml"
    spec.write_text(SPEC.format(a="a" * 64, b="b" * 64))
    bad.write_text("# not a study\nfoo bar\n")
    for name, text in (("trunc", ""), ("empty", "{}")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "choice.json").write_text(text)
    fill = {"dir": str(tmp_path), "spec": str(spec), "bad": str(bad)}
    assert st.main([a.format(**fill) for a in args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("study: error: " + message.format(**fill)) and err.count("\n") == 1


def test_status_shows_the_tuning_runs_so_far(study, tmp_path):
    spec, where = st.stage_sweeps(study, "tune", tmp_path)[0]  # warm start A only
    for run in st.sweep.expand(spec, where):
        label = run.name.split("_seed=")[0].removeprefix("method=")
        if label != "entr@1" or run.overrides["seed"] == 100:
            _finish(run.run_dir, label, run.overrides["seed"],
                    {"entr@0": -1.0, "entr@1": -0.5}.get(label, -2.0) - run.overrides["seed"] / 1000)
    rows = st.tune_status(study, tmp_path)
    assert [(r["label"], r["own"], r["done"], r["expected"]) for r in rows] == [
        ("entr@0", {"tau": 1.0}, 2, 4), ("entr@1", {"tau": 4.0}, 1, 4),
        ("grpo_async", {"kl_coef": 0.0}, 2, 4)]
    assert rows[0]["mean"] == pytest.approx(-1.1005)
    assert rows[1]["values"] == {"A/100": pytest.approx(-0.6)}
    table = sr.format_tune_status("eval_ref_logp_after", rows).splitlines()
    assert table[:2] == ["tuning runs finished: 5 of 12", ""]
    assert table[5] == "| entr@1 | tau=4 | 1/4 | -0.60000 | A/100: -0.60000 |"


def test_plan_names_every_stage_label_and_where_each_test_arm_gets_its_values(study):
    p = st.plan(study)
    assert p["tune_methods"] == ["entr@0", "entr@1", "grpo_async"]
    assert p["tune_runs"] == 3 * 2 * 2  # labels x tuning seeds x warm starts
    assert p["test_arms"] == {"grpo_sync": "untuned: its [comparison.methods] values",
                              "grpo_async": "untuned: its [comparison.methods] values",
                              "entr": "tuned: the choose stage's candidate"}
    assert p["test_runs"] == 3 * 3 * 2
    ruled = st.plan(dict(study, preregistration={**study["preregistration"], "rule_arm": "entr"}))
    assert ruled["test_arms"]["entr_rule"] == "tau from the baseline's tuning runs (choose)"
    assert ruled["test_runs"] == 4 * 3 * 2


def test_report_pairs_by_warm_start_and_seed():
    rows = []
    for ws, shift in (("A", 0.0), ("B", 1.0)):  # a warm-start effect the pairing removes
        for seed, noise in zip(range(5), (0.1, -0.2, 0.05, 0.0, 0.3)):
            rows.append({"arm": "grpo_async", "ws": ws, "seed": seed, "path": "",
                         "m": shift + noise})
            rows.append({"arm": "entr", "ws": ws, "seed": seed, "path": "",
                         "m": shift + noise + 0.1 + 0.01 * seed})
    p = sr.paired(rows, "entr", "grpo_async", "m")
    d = [0.1 + 0.01 * s for s in range(5)] * 2
    mean = sum(d) / 10
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / 9)
    assert p["n"] == 10 and p["mean"] == pytest.approx(mean) and p["sd"] == pytest.approx(sd)
    half = 2.2621571627982053 * sd / math.sqrt(10)  # t_{0.975, 9}
    assert p["ci95"] == [pytest.approx(mean - half), pytest.approx(mean + half)]
    assert p["by_ws"] == {"A": pytest.approx(0.12), "B": pytest.approx(0.12)}



def test_the_report_stage_pairs_the_test_runs_and_says_an_interim_look(study, tmp_path, capsys):
    spec = tmp_path / "study.toml"
    spec.write_text(SPEC.format(a="a" * 64, b="b" * 64))
    out = tmp_path / "out"
    out.mkdir()
    (out / "choice.json").write_text(json.dumps({"chosen": {"entr": {"own": {"tau": 4.0}}}}))
    assert st.main(["report", str(spec), "--out", str(out)]) == 2
    assert capsys.readouterr().err == (f"study: error: no finished test runs under {out / 'test'}: "
                                       "run the test stage first (or pass the --out it wrote)\n")
    for sweep_spec, where in st.stage_sweeps(study, "test", out, {"chosen": {"entr": {"own": {"tau": 4.0}}}}):
        for run in st.sweep.expand(sweep_spec, where):
            label, seed = run.name.split("_seed=")[0].removeprefix("method="), run.overrides["seed"]
            base = -1.0 - 0.01 * seed + (0.1 if where.name == "B" else 0.0)
            if label == "grpo_async":
                _finish(run.run_dir, label, seed, base, acc=0.5)
            elif label == "entr":  # differences 0.02, 0.03, 0.04 on each warm start
                _finish(run.run_dir, label, seed, base + 0.02 + 0.01 * seed, acc=0.6)
            elif seed == 0 and where.name == "A":  # one sync run: no interval
                _finish(run.run_dir, label, seed, base + 0.05)
    assert st.main(["report", str(spec), "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "test runs finished: 13 of 18 (INTERIM: not the pre-registered analysis)"
    # d = .02, .03, .04 twice: mean .03, sd .0089443; t_{.975,5} 2.5706 x sd / sqrt 6 = .0094;
    # detectable (2.5706 + t_{.8,5} .9195) sd / sqrt 6 = .0127
    assert lines[5] == "| grpo_async |  | 6 | -0.9600 [-1.0182, -0.9018] |  |  |  | -0.0500 (n=1) | 0.0100 |"
    # d = .02, .03, .04 on each warm start: mean .03, sd .0089443; t_{.975,5} 2.5706 sd /
    # sqrt 6 = .0094; detectable (2.5706 + t_{.8,5} .9195) sd / sqrt 6 = .0127
    assert lines[6] == ("| entr | tau=4 | 6 | -0.9300 [-0.9875, -0.8725] | +0.0300 [+0.0206, +0.0394] "
                        "| 0.0127 | A +0.0300 / B +0.0300 | -0.0300 (n=1) | 0.0100 |")
    assert lines[7] == "| grpo_sync |  | 1 | -0.9500 (n=1) | +0.0500 (n=1) | n/a | A +0.0500 |  | 0.0100 |"
    assert lines[-2:] == ["| entr | +0.100 [+0.100, +0.100] |", "| grpo_sync | +0.000 (n=1) |"]
    report = json.loads((out / "report.json").read_text())
    assert report["arms"]["entr"]["vs_baseline"]["eval_ref_logp_after"]["n"] == 6
    assert (out / "report.md").read_text().splitlines() == lines
    assert st.main(["report", str(spec), "--out", str(out), "--figures"]) == 0
    assert (out / "report_paired.png").stat().st_size > 0


def test_the_report_figure_draws_each_arms_paired_interval_and_warm_starts():
    import matplotlib

    matplotlib.use("Agg")
    from experiments.analysis.study_plots import paired_figure

    d = {"mean": 0.03, "ci95": [0.02, 0.045], "n": 6, "detectable_80": 0.0127,
         "by_ws": {"A": 0.025, "B": 0.035}}
    one = {"mean": -0.01, "ci95": None, "n": 1, "detectable_80": float("nan"), "by_ws": {"A": -0.01}}
    report = {"primary_metric": "m", "baseline": "b", "runs_done": 13, "runs_expected": 18,
              "arms": {"b": {}, "entr": {"vs_baseline": {"m": d}}, "sync": {"vs_baseline": {"m": one}}}}
    ax = paired_figure(report).axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["entr (n=6)", "sync (n=1)"]
    (entr_bar, sync_bar) = ax.containers
    segs = entr_bar.lines[2][0].get_segments()[0]  # the interval, at the top row
    assert segs[:, 0].tolist() == [0.02, 0.045] and segs[:, 1].tolist() == [1.0, 1.0]
    assert sync_bar.lines[2][0].get_segments()[0][:, 0].tolist() == [-0.01, -0.01]
    markers = [(line.get_xdata()[0], line.get_ydata()[0]) for line in ax.lines
               if line.get_marker() in "^v"]
    assert markers == [(0.025, 0.8), (0.035, 0.8), (-0.01, -0.2)]
    band = ax.patches[0]  # +- the largest detectable difference
    assert band.get_x() == -0.0127 and band.get_x() + band.get_width() == pytest.approx(0.0127)
    assert ax.get_title() == "13 of 18 test runs (interim)"


def test_stage_times_sum_the_run_walls_and_span_the_calendar(tmp_path):
    rows = []
    for i, (ws, start, wall) in enumerate([("A", "2026-12-05T01:00:00+0000", 600.0),
                                           ("A", "2026-12-05T03:00:00+0100", 900.5),
                                           ("B", None, 100.0)]):
        path = tmp_path / str(i)
        path.mkdir()
        (path / "summary.json").write_text(json.dumps({"wall_clock_s": wall}))
        if start:
            (path / "meta.json").write_text(json.dumps({"started_at": start}))
        rows.append({"ws": ws, "path": str(path)})
    times = sr.stage_times(rows)
    # 03:00+01:00 is 02:00 UTC; it ends 15 min later
    assert times == {"A": {"runs": 2, "wall_s": 1500.5, "first_start": "2026-12-05T01:00",
                           "last_end": "2026-12-05T02:15"},
                     "B": {"runs": 1, "wall_s": 100.0, "first_start": None, "last_end": None}}
    assert sr.format_stage_times({"tune": times}).splitlines()[2:] == [
        "| tune | A | 2 | 1,500 | 2026-12-05T01:00 | 2026-12-05T02:15 |",
        "| tune | B | 1 | 100 | - | - |"]


def test_mask_fraction_is_the_mean_over_steps_and_survives_a_cut_last_line(tmp_path):
    from experiments.run.jsonl import PartialLineWarning

    (tmp_path / "metrics.jsonl").write_text(
        '{"step": 0, "mask/fraction": 0.25}\n{"step": 1}\n{"step": 2, "mask/fraction": 0.5}\n'
        '{"step": 3, "mask/fr')
    with pytest.warns(PartialLineWarning, match="metrics.jsonl:4: dropped a partial last line"):
        assert sr.mask_fraction(str(tmp_path)) == 0.375
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n')
    assert sr.mask_fraction(str(tmp_path)) == 0.0  # an objective without a gate


def test_the_tuning_figure_draws_each_candidates_runs_mean_and_the_choice(study):
    import matplotlib

    matplotlib.use("Agg")
    from experiments.analysis.study_plots import tuning_figure

    rows = [{"arm": arm, "ws": ws, "seed": seed, "eval_ref_logp_after": v}
            for arm, ws, seed, v in [("entr@0", "A", 100, -1.0), ("entr@0", "B", 100, -2.0),
                                     ("entr@1", "A", 100, -0.5), ("grpo_async", "A", 100, -0.75)]]
    ax = tuning_figure(study, rows, {"chosen": {"entr": {"index": 1}}}).axes[0]
    means = [(c.get_segments()[0][0].tolist(), c.get_color()[0].tolist()) for c in ax.collections]
    red, grey = matplotlib.colors.to_rgba("red"), matplotlib.colors.to_rgba("0.2")
    assert means == [([-0.3, -1.5], list(grey)), ([0.7, -0.5], list(red))]  # candidate 1 chosen
    runs = sorted((line.get_xdata()[0], line.get_ydata()[0]) for line in ax.lines
                  if line.get_marker() in "os")
    assert runs == [(-0.04, -1.0), (0.04, -2.0), (0.96, -0.5)]
    from experiments.analysis.styles import method_style

    arm_lines = [line for line in ax.lines if line.get_label() == "grpo_async (mean)"]
    assert [line.get_ydata()[0] for line in arm_lines] == [-0.75]  # in the arm's own style
    assert arm_lines[0].get_color() == method_style("grpo_async")["color"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["tau 1", "tau 4"]

def test_detectable_difference_of_a_paired_t_test():
    # (t_{0.975,9} + t_{0.8,9}) / sqrt(10) = (2.2622 + 0.8834) / 3.1623
    assert sr.detectable_difference(1.0, 10) == pytest.approx(0.99472, abs=1e-4)
    assert sr.detectable_difference(2.0, 10) == pytest.approx(2 * 0.99472, abs=2e-4)
    assert math.isnan(sr.detectable_difference(1.0, 1))


@pytest.mark.parametrize("edit, message", [
    (lambda s: s.replace('baseline = "grpo_async"', 'baseline = "nope"'), "arm 'nope' is not"),
    (lambda s: s.replace("test_seeds = [0, 1, 2]", "test_seeds = [100, 1]"), "overlap"),
    (lambda s: s.replace('[tuning.entr]', '[tuning.kpop]'), r"\[tuning.kpop\] names no"),
    (lambda s: s.replace('primary_metric = "eval_ref_logp_after"\n', ''), "lacks"),
    (lambda s: s.replace('name = "A"\n', ''), "needs exactly name, path, sha256"),
    (lambda s: s.replace('baseline = "grpo_async"', 'baseline = "grpo_async"\nrule_tokens = "some"'),
     'rule_tokens must be "all" or "material", got \'some\''),
])
def test_a_bad_study_spec_is_refused_naming_the_key(tmp_path, edit, message):
    path = tmp_path / "s.toml"
    path.write_text(edit(SPEC.format(a="a" * 64, b="b" * 64)))
    with pytest.raises(ValueError, match=message):
        st.load_study(path)


STUDIES = sorted((st.pathlib.Path(__file__).resolve().parents[1] / "experiments" / "studies").glob("*.toml"))


@pytest.mark.parametrize("path", STUDIES, ids=lambda p: p.name)
def test_every_shipped_study_is_runnable_and_its_warm_starts_are_the_frozen_ones(path, tmp_path):
    """A shipped study loads, every method of each stage parses with the job's own CLI, the
    comparison protocol holds, and each warm start's weights hash to the recorded sha256."""
    from experiments.multirun import comparison
    from experiments.run.preflight import weights_sha256
    from experiments.run.cli import parse

    study = st.load_study(path)
    root = path.parents[2]
    for ws in study["preregistration"]["warm_starts"]:
        assert weights_sha256(root / ws["path"]) == ws["sha256"], ws["name"]
    fake_choice = {"chosen": {}, "rule": {"tau": 3.0}}
    for stage, choice in (("tune", None), ("test", fake_choice)):
        for spec, where in st.stage_sweeps(study, stage, tmp_path, choice):
            runs = st.sweep.expand(spec, where)
            comparison.verify(spec, runs)
            seen = set()
            for run in runs:
                label = run.name.split("_seed=")[0]
                if label in seen:
                    continue
                seen.add(label)
                cfg, _ = parse(run.command(spec["preset"])[3:])
                assert cfg.model.sha256 == run.overrides["model.sha256"]


def test_one_warm_start_at_a_time(study, tmp_path):
    only_b = st.stage_sweeps(study, "tune", tmp_path, warm_start="B")
    assert [d.name for _, d in only_b] == ["B"] and only_b[0][0]["fixed"]["model.path"] == "ws/b"
    with pytest.raises(ValueError, match=r"--warm-start 'C': the study's warm starts are \['A', 'B'\]"):
        st.stage_sweeps(study, "tune", tmp_path, warm_start="C")


def test_a_stage_runs_in_paired_blocks_of_seed_and_warm_start(study, tmp_path, monkeypatch):
    started, checked = [], []
    monkeypatch.setattr(st.sweep, "run_runs", lambda preset, runs, workers: started.extend(
        (r.run_dir.parent.name, r.name) for r in runs) or [])
    # the tree's provenance is checked once the selection is good (tests/test_provenance.py)
    monkeypatch.setattr(st.provenance, "check_tree", lambda *a: checked.append(a))
    st.run_stage(study, "tune", tmp_path, workers=2)
    assert checked == [(tmp_path, "tune", False)]
    methods = ("entr@0", "entr@1", "grpo_async")
    assert started == [(ws, f"method={m}_seed={s}") for s in (100, 101) for ws in "AB"
                       for m in methods]
    started.clear()
    with pytest.raises(ValueError, match=r"--only '\(' is not a regular expression"):
        st.run_stage(study, "tune", tmp_path / "bad", workers=2, only="(")
    assert not (tmp_path / "bad").exists()  # nothing written before the refusal
    st.run_stage(study, "tune", tmp_path, workers=2, only="grpo", warm_start="B")
    assert started == [("B", "method=grpo_async_seed=100"), ("B", "method=grpo_async_seed=101")]


def test_archive_keeps_the_small_files_and_the_baselines_token_samples(study, tmp_path):
    out, to = tmp_path / "out", tmp_path / "archive"
    for spec, where in st.stage_sweeps(study, "tune", out, warm_start="A"):
        for run in st.sweep.expand(spec, where):
            _finish(run.run_dir, "x", run.overrides["seed"], -1.0)
            (run.run_dir / "token_samples").mkdir()
            (run.run_dir / "token_samples" / "step_0.npz").write_bytes(b"z")
            (run.run_dir / "checkpoints").mkdir()
    (out / "tune" / "A" / "method=entr@0_seed=100" / "summary.json").unlink()  # unfinished
    assert study_archive.archive(study, out, to) == 5
    kept = sorted(p.relative_to(to).as_posix() for p in to.rglob("*") if p.is_file())
    assert "tune/A/method=grpo_async_seed=100/token_samples/step_0.npz" in kept
    assert not any("entr@1_seed=100/token_samples" in k or "checkpoints" in k for k in kept)
    assert not any(k.startswith("tune/A/method=entr@0_seed=100") for k in kept)
    assert "tune/A/method=entr@1_seed=101/summary.json" in kept


def test_the_rule_tau_comes_from_all_or_the_material_tokens_as_registered():
    """The rule arm's tau over the baseline's tuning tokens (the stored slice of the fp8
    study): the registered ``rule_tokens`` picks all tokens or only those with |delta| >
    0.01, each the decomposition's own 2 % threshold; a value neither is refused."""
    from experiments.analysis import decompose
    from experiments.analysis.runs import load_run

    root = pathlib.Path(__file__).parent / "data" / "study_slice"
    study = st.load_study("experiments/studies/stress_fp8.toml")
    assert study["preregistration"]["rule_tokens"] == "all"   # the fp8 study's registration
    tokens, seq = decompose.load([load_run(root / "tune" / "A" / "method=grpo_async_seed=1000")])
    gates = decompose.gate_report(tokens, seq, 0.01)
    rule = st.rule_tau(study, root)
    assert rule["tau"] == gates["tau_rule_2pct"] and rule["rule_tokens"] == "all"
    material = dict(study, preregistration={**study["preregistration"], "rule_tokens": "material"})
    assert st.rule_tau(material, root)["tau"] == gates["material"]["tau_rule_2pct"]
    assert gates["material"]["tau_rule_2pct"] > 10 * gates["tau_rule_2pct"]
