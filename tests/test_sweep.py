"""Sweep expansion, emission, skipping and summaries (no training here)."""

import json
import pathlib
import shlex

import pytest

from experiments import sweep

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
    assert table.count("\n") == 11


def test_interrupted_runs_resume(spec, tmp_path, monkeypatch):
    runs = sweep.expand(spec, tmp_path / "out")
    (runs[0].run_dir / "checkpoints" / "3").mkdir(parents=True)
    seen = []

    class Done:
        returncode = 0

    monkeypatch.setattr(sweep.subprocess, "run", lambda cmd, **k: seen.append(cmd) or Done())
    sweep.run_local(spec, tmp_path / "out", workers=1)
    assert len(seen) == 10
    resumed = [c for c in seen if "--resume" in c]
    assert len(resumed) == 1 and str(runs[0].run_dir) in resumed[0]


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
    from experiments.run import parse

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
