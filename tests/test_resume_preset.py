"""``--resume`` reads the run's own config.json: the preset may be left out, a preset
other than the one the run started from is said not to be used (no other preset's
checks apply), and without a preset a run directory with no config.json is refused."""

import pytest

from experiments.run import cli
from experiments.run.errors import ConfigError


@pytest.fixture
def saved_run(tmp_path):
    """A quickstart run's directory with its config.json (seed 5, 7 RL steps)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cfg, _ = cli.parse(["quickstart", "--run_dir", str(run_dir), "--seed", "5", "--rl_steps", "7"])
    (run_dir / "config.json").write_text(cfg.to_json())
    return run_dir, cfg


def test_resume_without_a_preset_is_the_runs_own_configuration(saved_run, capsys):
    run_dir, saved = saved_run
    cfg, opts = cli.parse(["--run_dir", str(run_dir), "--resume"])
    assert opts.resume and cfg == saved and cfg.rl_steps == 7
    cfg, _ = cli.parse(["--run_dir", str(run_dir), "--resume", "--rl_steps", "9"])
    assert cfg.rl_steps == 9 and cfg.seed == 5  # only the field given changes
    assert capsys.readouterr().err == ""


def test_another_preset_on_resume_is_said_not_to_be_used(saved_run, capsys):
    run_dir, saved = saved_run
    cfg, _ = cli.parse(["math", "--run_dir", str(run_dir), "--resume"])  # no model.path needed
    assert cfg == saved
    assert capsys.readouterr().err == (
        f"entr-run: note: resuming {run_dir} with its own configuration (started from preset "
        "'quickstart'; its method: objective.name=entr, staleness.mode=simulated); preset "
        "'math' is not used\n")
    assert cli.parse(["quickstart", "--run_dir", str(run_dir), "--resume"])[0] == saved
    assert capsys.readouterr().err == ""


def test_the_preset_on_a_run_of_another_method_is_said_unused(tmp_path, capsys):
    """A sweep's async GRPO run resumed as `entr-run quickstart --run_dir DIR --resume`
    used to show that run's summary with no word that quickstart was not used."""
    run_dir = tmp_path / "method=grpo_async_seed=0"
    run_dir.mkdir()
    cfg, _ = cli.parse(["quickstart", "--run_dir", str(run_dir), "--name", run_dir.name,
                        "--objective.name", "grpo", "--staleness.mode", "async"])
    (run_dir / "config.json").write_text(cfg.to_json())
    (run_dir / "summary.json").write_text("{}")  # finished
    capsys.readouterr()
    assert cli.parse(["quickstart", "--run_dir", str(run_dir), "--resume"])[0] == cfg
    assert (f"entr-run: note: resuming {run_dir} with its own configuration (run "
            "'method=grpo_async_seed=0'; its method: objective.name=grpo, staleness.mode=async); "
            "preset 'quickstart' is not used\n") in capsys.readouterr().err
    # the preset's own name, another method: still said
    cfg, _ = cli.parse(["quickstart", "--run_dir", str(run_dir), "--objective.name", "grpo"])
    (run_dir / "config.json").write_text(cfg.to_json())
    cli.parse(["quickstart", "--run_dir", str(run_dir), "--resume"])
    assert "(started from preset 'quickstart'; its method: objective.name=grpo, " \
        "staleness.mode=simulated); preset 'quickstart' is not used" in capsys.readouterr().err


def test_resume_of_a_directory_with_no_run_is_refused_naming_the_fix(tmp_path, entr_run):
    """A typo in --run_dir with --resume used to start a fresh full run."""
    typo = tmp_path / "runs" / "quikstart"
    code, err = entr_run(["quickstart", "--run_dir", str(typo), "--resume"])
    assert (code, err) == (2, f"entr-run: error: nothing to resume at {typo}: it holds no run "
                              "(no config.json, metrics.jsonl, checkpoint or summary.json); "
                              "drop --resume to start a run there, or give the --run_dir of "
                              "the run to continue")
    assert not typo.exists()  # nothing written


def test_resume_without_a_preset_needs_a_saved_configuration(tmp_path):
    with pytest.raises(ConfigError, match=f"cannot resume without a preset: {tmp_path}/none/"
                                          "config.json does not exist; give the run's --run_dir"):
        cli.parse(["--run_dir", str(tmp_path / "none"), "--resume"])
    with pytest.raises(ConfigError, match="the first argument must be a preset"):
        cli.parse(["--run_dir", str(tmp_path / "none")])  # no --resume: a preset is needed
