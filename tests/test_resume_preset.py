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
        "'quickstart'); preset 'math' is not used\n")
    assert cli.parse(["quickstart", "--run_dir", str(run_dir), "--resume"])[0] == saved
    assert capsys.readouterr().err == ""


def test_resume_without_a_preset_needs_a_saved_configuration(tmp_path):
    with pytest.raises(ConfigError, match=f"cannot resume without a preset: {tmp_path}/none/"
                                          "config.json does not exist; give the run's --run_dir"):
        cli.parse(["--run_dir", str(tmp_path / "none"), "--resume"])
    with pytest.raises(ConfigError, match="the first argument must be a preset"):
        cli.parse(["--run_dir", str(tmp_path / "none")])  # no --resume: a preset is needed
