"""Sweep expansion, emission, skipping and summaries (no training here)."""

import json
import pathlib
import shlex

import pytest

from experiments.multirun import sweep

SPEC = """
preset = "cpu_staleness"
seeds = [0, 1]
[[grid]]
"objective.name" = ["entr", "grpo"]
"staleness.inter_lag" = [1, 5]
[[grid]]
"objective.name" = ["entr"]
"staleness.inter_lag" = [1]
"staleness.intra_switches" = [3]
[fixed]
rl_steps = 7
"""


@pytest.fixture
def spec(tmp_path):
    path = tmp_path / "spec.toml"
    path.write_text(SPEC)
    return sweep.load_spec(path)


def test_expand_is_a_deduplicated_grid_times_seeds(spec, tmp_path):
    runs = sweep.expand(spec, tmp_path / "out")
    assert len(runs) == 2 * 2 * 2 + 1 * 2
    names = [r.name for r in runs]
    assert len(set(names)) == len(names)
    first = runs[0]
    assert first.name == "name=entr_inter_lag=1_seed=0"
    assert first.overrides == {"rl_steps": 7, "objective.name": "entr",
                               "staleness.inter_lag": 1, "seed": 0}
    assert first.run_dir == tmp_path / "out" / first.name


def test_emit_writes_one_runnable_command_per_run(spec, tmp_path):
    lines = sweep.emit(spec, tmp_path / "out")
    assert len(lines) == 10
    argv = shlex.split(lines[-1])
    assert argv[1:4] == ["-m", "experiments.run", "cpu_staleness"]
    i = argv.index("--staleness.intra_switches")
    assert argv[i + 1] == "3"
    assert "--resume" not in argv
    i = argv.index("--shared_eval_dir")  # the runs evaluate their common start once
    assert argv[i + 1] == str(tmp_path / "out" / sweep.SHARED_EVAL)


def test_shared_evaluation_reaches_the_config_and_can_be_turned_off(tmp_path):
    from experiments.run.cli import parse

    spec = sweep.load_spec(ROOT / "experiments/sweeps/stress_methods.toml")
    runs = sweep.expand(spec, tmp_path / "out")
    cfg, _ = parse(runs[0].command(spec["preset"])[3:])
    assert cfg.shared_eval_dir == str(tmp_path / "out" / "shared_eval")
    off = sweep.expand(sweep.apply_set(spec, sweep.parse_set(["shared_eval_dir=''"])),
                       tmp_path / "out")
    argv = off[0].command(spec["preset"])
    assert argv.count("--shared_eval_dir") == 1
    cfg, _ = parse(argv[3:])
    assert cfg.shared_eval_dir == ""


def test_finished_runs_are_skipped_and_summarized(spec, tmp_path, monkeypatch):
    runs = sweep.expand(spec, tmp_path / "out")
    for r in runs:
        r.run_dir.mkdir(parents=True)
        (r.run_dir / "summary.json").write_text(json.dumps(
            {"eval_accuracy_before": 0.1, "eval_accuracy_after": 0.25, "final_reward": 0.5,
             "rl_steps": 7, "wall_clock_s": 3.0}))
    monkeypatch.setattr(sweep.subprocess, "run", lambda *a, **k: pytest.fail("ran a finished run"))
    records = sweep.run_local(spec, tmp_path / "out", workers=2)
    assert all(rec["status"].startswith("skipped") for rec in records) and len(records) == 10
    rows = sweep.summarize(tmp_path / "out")
    assert len(rows) == 10 and rows[0]["eval_accuracy_after"] == 0.25
    table = sweep.format_table(rows)
    assert table.count("\n") == 13  # header, rule, 10 rows, a blank line, the wall note
    head, _, *body = table.splitlines()
    assert head == ("| run | eval_accuracy_before | eval_accuracy_after | final_reward | rl_steps | "
                    "wall_clock_s (machine time) |")
    assert body[-1] == (
        "wall_clock_s (machine time): each run's elapsed seconds on this machine, shared with "
        "the runs beside it and any other load; not a cost of the method (compare methods by "
        "steps, or time them alone with benchmarks/)")


def test_progress_line_names_the_run_its_status_wall_time_and_eta():
    line = sweep.progress_line({"name": "method=entr_seed=0", "status": "ok", "wall_s": 72.4},
                               done=2, total=5, elapsed_s=100.0, workers=2)
    assert line == ("sweep: [2/5] method=entr_seed=0: ok in 1 min 12 s (wall clock, 2 at a "
                    "time); ETA 2 min 30 s for the 3 left")
    assert sweep.progress_line({"name": "x", "status": "rc=1", "wall_s": 3725.0}, 4, 4, 9e3, 1) == (
        "sweep: [4/4] x: rc=1 in 1 h 02 min (wall clock, 1 at a time); all done")


def test_run_prints_a_progress_line_per_run_as_it_ends(spec, tmp_path, monkeypatch, capsys):
    """Before, `sweep run` printed nothing until every run had finished."""
    class Done:
        def __init__(self, cmd):
            self.returncode = 3 if "seed=1" in cmd[cmd.index("--run_dir") + 1] else 0

    monkeypatch.setattr(sweep.subprocess, "run", lambda cmd, **k: Done(cmd))
    spec_path = tmp_path / "spec.toml"
    spec_path.write_text(SPEC)
    assert sweep.main(["run", str(spec_path), "--out", str(tmp_path / "out"), "--workers", "1",
                       "--only", "inter_lag=5_"]) == 1
    out, err = capsys.readouterr()
    lines = [ln for ln in err.splitlines() if ln.startswith("sweep: [")]
    names = [r.name for r in sweep.select(sweep.expand(spec, tmp_path / "out"), "inter_lag=5_")]
    assert [ln.split("] ", 1)[1].split(":")[0] for ln in lines] == names  # one per run, in order
    assert [ln.split("] ", 1)[0] for ln in lines] == [f"sweep: [{i}/4" for i in range(1, 5)]
    assert [ln.split(": ", 2)[2].split(" in ")[0] for ln in lines] == [
        "rc=3" if "seed=1" in n else "ok" for n in names]
    assert all("(wall clock, 1 at a time); ETA " in ln for ln in lines[:3])
    assert lines[3].endswith("(wall clock, 1 at a time); all done")
    records = [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")]
    assert [r["name"] for r in records] == names and all(r["wall_s"] >= 0 for r in records)


def test_interrupted_runs_resume(spec, tmp_path, monkeypatch):
    runs = sweep.expand(spec, tmp_path / "out")
    (runs[0].run_dir / "checkpoints" / "3").mkdir(parents=True)
    # stopped before its first checkpoint: the CLI refuses the directory without --resume
    (runs[1].run_dir / "checkpoints").mkdir(parents=True)
    (runs[1].run_dir / "metrics.jsonl").write_text('{"step": 0}\n')
    seen = []

    class Done:
        returncode = 0

    monkeypatch.setattr(sweep.subprocess, "run", lambda cmd, **k: seen.append(cmd) or Done())
    sweep.run_local(spec, tmp_path / "out", workers=1)
    assert len(seen) == 10
    resumed = [c for c in seen if "--resume" in c]
    assert len(resumed) == 2
    assert sorted(c[c.index("--run_dir") + 1] for c in resumed) == sorted(
        str(r.run_dir) for r in runs[:2])


@pytest.mark.parametrize("text, match", [
    ('seeds = [0]', "preset"),
    ('preset = "x"\nbogus = 1', "unknown keys"),
    ('preset = "x"\n[[grid]]\n"a.b" = []', "grid\\[0\\].a.b"),
])
def test_bad_specs_name_the_key(tmp_path, text, match):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=match):
        sweep.load_spec(path)


SHIPPED_SPECS = sorted((pathlib.Path(__file__).resolve().parents[1] / "experiments" / "sweeps").glob("*.toml"))


@pytest.mark.parametrize("path", SHIPPED_SPECS, ids=lambda p: p.name)
def test_every_shipped_spec_emits_commands_the_cli_accepts(path, tmp_path):
    """Each kind of run of a shipped spec (per method and set of fields) parses with the
    job's own CLI, which refuses e.g. a lag field on a sync run; no two runs share
    their overrides (a sync baseline in a lag grid runs once per remaining setting)."""
    from experiments.run.cli import parse

    spec = sweep.load_spec(path)
    runs = sweep.expand(spec, tmp_path)
    assert len({json.dumps(r.overrides, sort_keys=True) for r in runs}) == len(runs)
    shapes = {}  # one run per method and set of fields given: the CLI checks fields, not values
    for r in runs:
        shapes.setdefault((r.name.split("_")[0], tuple(sorted(r.overrides))), r)
    for run in shapes.values():
        argv = run.command(spec["preset"])[3:]
        cfg, _ = parse(argv)
        assert cfg.seed == run.overrides["seed"] and cfg.run_dir == str(run.run_dir)
        if cfg.staleness.mode == "sync":
            assert not any(a.startswith("--staleness.inter_lag") for a in argv), run.name


def test_only_runs_the_slice_whose_names_match(spec, tmp_path, monkeypatch, capsys):
    seen = []

    class Done:
        returncode = 0

    monkeypatch.setattr(sweep.subprocess, "run", lambda cmd, **k: seen.append(cmd) or Done())
    sweep.run_local(spec, tmp_path / "out", workers=1, only=r"inter_lag=5_")
    assert len(seen) == 4 and all(c[c.index("--staleness.inter_lag") + 1] == "5" for c in seen)
    assert len(sweep.emit(spec, tmp_path / "out", only="seed=1$")) == 5
    with pytest.raises(ValueError, match="matches none of the 10 run names"):
        sweep.select(sweep.expand(spec, tmp_path / "out"), "inter_lag=99")
    spec_path = tmp_path / "spec.toml"
    spec_path.write_text('preset = "cpu_staleness"\nseeds = [0]\n[[grid]]\nrl_steps = [1]\n')
    assert sweep.main(["emit", str(spec_path), "--out", str(tmp_path), "--only", "("]) == 2
    assert "--only '(' is not a regular expression" in capsys.readouterr().err


def test_set_replaces_fixed_entries_with_typed_values(spec, tmp_path, capsys):
    sets = sweep.parse_set(["rl_steps=3", "optim.learning_rate=5e-5", "model.path=runs/a/b",
                            "sampler.top_p=1", "logging.wandb=true", 'name="x y"'])
    assert sets == {"rl_steps": 3, "optim.learning_rate": 5e-5, "model.path": "runs/a/b",
                    "sampler.top_p": 1, "logging.wandb": True, "name": "x y"}
    changed = sweep.apply_set(spec, {"rl_steps": 3})
    assert changed["fixed"] == {"rl_steps": 3} and spec["fixed"] == {"rl_steps": 7}
    assert all(r.overrides["rl_steps"] == 3 for r in sweep.expand(changed, tmp_path))
    with pytest.raises(ValueError, match="expected KEY=VALUE"):
        sweep.parse_set(["rl_steps"])
    with pytest.raises(ValueError, match="staleness.inter_lag: varied by the spec's grid"):
        sweep.apply_set(spec, {"staleness.inter_lag": 2})
    spec_path = tmp_path / "spec.toml"
    spec_path.write_text(SPEC)
    assert sweep.main(["emit", str(spec_path), "--out", str(tmp_path), "--set", "rl_steps=2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 10 and all(shlex.split(ln)[shlex.split(ln).index("--rl_steps") + 1]
                                    == "2" for ln in lines)


def test_seeds_replace_the_specs_seeds(tmp_path, capsys):
    """SPEC has seeds [0, 1] and 5 points: --seeds 3 4 3 gives the same 5 points at seeds
    3 and 4 (a repeat once), named like the spec's own so they join the same --out."""
    spec_path = tmp_path / "spec.toml"
    spec_path.write_text(SPEC)
    assert sweep.main(["emit", str(spec_path), "--out", str(tmp_path), "--seeds", "3", "4",
                       "3"]) == 0
    lines = [shlex.split(ln) for ln in capsys.readouterr().out.splitlines()]
    seeds = sorted(int(a[a.index("--seed") + 1]) for a in lines)
    assert seeds == [3] * 5 + [4] * 5
    assert all(a[a.index("--run_dir") + 1].endswith(f"seed={a[a.index('--seed') + 1]}")
               for a in lines)
    with pytest.raises(SystemExit):
        sweep.main(["emit", str(spec_path), "--out", str(tmp_path), "--seeds", "x"])


ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_reuse_copies_finished_runs_with_the_same_resolved_config(tmp_path, monkeypatch):
    path = tmp_path / "spec.toml"
    path.write_text('preset = "quickstart"\nseeds = [0, 1]\n[[grid]]\n"objective.name" = '
                    '["entr", "grpo"]\n[fixed]\nrl_steps = 3\n')
    spec = sweep.load_spec(path)
    runs = sweep.expand(spec, tmp_path / "out")
    source = tmp_path / "other"
    for i, run in enumerate(runs[:2]):  # runs[0]: same config; runs[1]: one field differs
        config = sweep.resolved_config(spec, run)
        config.update(name="elsewhere", run_dir=str(source / f"r{i}"))
        config["logging"]["wandb_group"] = "another label"
        if i == 1:
            config["optim"]["learning_rate"] *= 2
        d = source / f"r{i}"
        (d / "checkpoints" / "7").mkdir(parents=True)
        (d / "ring").mkdir()
        (d / "eval").mkdir()
        (d / "eval" / "after_rl.json").write_text("{}")
        (d / "config.json").write_text(json.dumps(config))
        (d / "summary.json").write_text(json.dumps({"eval_accuracy_after": 0.5 + i}))
    seen = []

    class Done:
        returncode = 0

    monkeypatch.setattr(sweep.subprocess, "run", lambda cmd, **k: seen.append(cmd) or Done())
    records = sweep.run_local(spec, tmp_path / "out", reuse=[source])
    assert [r["status"] for r in records].count(f"reused ({source / 'r0'})") == 1
    assert len(seen) == len(runs) - 1  # every run but the matching one ran
    got = runs[0].run_dir
    assert json.loads((got / "summary.json").read_text()) == {"eval_accuracy_after": 0.5}
    assert (got / "eval" / "after_rl.json").exists()
    assert not (got / "checkpoints").exists() and not (got / "ring").exists()
    config = json.loads((got / "config.json").read_text())
    assert config["run_dir"] == str(got) and config["name"] == sweep.resolved_config(
        spec, runs[0])["name"]
    assert json.loads((got / "reused_from.json").read_text())["source"] == str(source / "r0")
    assert not (runs[1].run_dir / "reused_from.json").exists()


def test_the_stored_stress_slice_is_stress_methods_narrowed_by_its_args(tmp_path):
    """tests/data/make_stress_runs.sh runs stress_methods.toml with the arguments of
    tests/data/stress_slice.args: the stored runs' configs are what they resolve to (all
    fields but labels; checkpoint.keep is inert with checkpoint.every = 0), so the CI slice
    is the regime's setting in small shapes, not a copy of it that can drift."""
    args = (ROOT / "tests/data/stress_slice.args").read_text().splitlines()
    only = args[args.index("--only") + 1]
    sets = sweep.parse_set([args[i + 1] for i, a in enumerate(args) if a == "--set"])
    assert sets["checkpoint.every"] == 0
    spec = sweep.apply_set(sweep.load_spec(ROOT / "experiments/sweeps/stress_methods.toml"), sets)
    stored = ROOT / "tests/data/stress_runs"
    runs = sweep.select(sweep.expand(spec, stored), only)
    assert sorted(r.name for r in runs) == sorted(
        p.parent.name for p in stored.glob("*/summary.json"))
    for run in runs:
        mine = sweep._identity(sweep.resolved_config(spec, run))
        theirs = sweep._identity(json.loads((run.run_dir / "config.json").read_text()))
        mine.pop("checkpoint.keep"), theirs.pop("checkpoint.keep")
        assert mine == theirs, run.name


def test_a_bad_set_on_a_comparison_spec_is_one_error_line(capsys):
    spec = str(ROOT / "experiments/sweeps/stress_methods.toml")
    assert sweep.main(["emit", spec, "--out", "/tmp/unused", "--set", "bogus.field=3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sweep: error: override 'bogus.field': RunConfig has no field")
    assert "Traceback" not in err
    regime = str(ROOT / "experiments/sweeps/stress_regime.toml")
    assert sweep.main(["emit", regime, "--out", "/tmp/unused",
                       "--set", "staleness.inter_lag=3"]) == 2
    assert "--set staleness.inter_lag: varied" in capsys.readouterr().err
    assert sweep.main(["emit", spec, "--out", "/tmp/unused", "--set", "objective.name=grpo"]) == 2
    assert "objective.name: set per method by the spec's [comparison]" in capsys.readouterr().err
    assert sweep.main(["emit", spec, "--out", "/tmp/unused", "--set", "rl_steps=abc"]) == 2
    assert capsys.readouterr().err.startswith("sweep: error: a [fixed] or --set value has "
                                              "the wrong type")
    assert sweep.main(["run", spec, "--out", "/tmp/unused", "--reuse", "/no/such/dir"]) == 2
    assert "--reuse /no/such/dir: not a directory" in capsys.readouterr().err


@pytest.mark.parametrize("args, line", [
    (["--bogus", "1"], "Unrecognized options: --bogus, 1"),
    (["--staleness.mode", "async", "--staleness.max_staleness", "x"],
     "Value error: Error parsing --staleness.max_staleness: invalid literal for int() with base "
     "10: 'x'"),
    (["--sampling.top_p", "2"],
     "Value error: Error parsing sampling: sampling.top_p must be in (0, 1], got 2.0"),
    (["--run_dir", "/dev/null/x"],
     "entr-run: error: run_dir /dev/null/x: /dev/null exists and is not a directory"),
])
def test_a_failed_runs_error_line_is_its_message_not_a_box_border(args, line, tmp_path):
    """tyro prints parse errors in a box; the line reported for a failed run is the box's
    message (its title and first paragraph), not its bottom border."""
    import subprocess
    import sys

    log = tmp_path / "sweep.log"
    log.write_text("SFT warm start:  10%|#  | 1/10 [00:01<00:09, 1.00it/s]\n")
    with open(log, "a") as f:  # as `run` starts a run: output to the log, the sweep's env
        subprocess.run([sys.executable, "-m", "experiments.run", "quickstart", *args],
                       stdout=f, stderr=subprocess.STDOUT, env=sweep.child_env(), timeout=300)
    assert sweep.last_error_line(log) == line
