"""A run interrupted before its first RL checkpoint loses nothing it finished: the warm
start continues from its checkpoint (weights, optimizer state, data position) bit for bit,
the finished evaluations are reused, not redone; a checkpoint whose steps ``sft.jsonl``
lacks falls back to the older one; a changed configuration starts over."""

import json

import pytest

from experiments.run import cli
from experiments.run.evaluation import Evaluator
from learners.checkpoint import CheckpointFallbackWarning
from learners.learner import Learner
from tests.small_job import crash_at, small_argv, with_job_options


def args(model_dir, run_dir, *extra):
    """6 SFT steps checkpointed every 2, then 2 RL steps checkpointed at step 2
    (`tests.small_job.small_argv`)."""
    return small_argv(model_dir, run_dir, "--sft.steps", "6", "--sft.warmup_steps", "1",
                      "--checkpoint.sft_every", "2", "--rl_steps", "2",
                      "--task.samples_per_prompt", "2", "--task.max_new_tokens", "4",
                      "--task.max_total_tokens", "4", *extra)


class Killed(KeyboardInterrupt):
    """Ctrl-C at a chosen point."""


def kill_at_sft_call(monkeypatch, n):
    """Ctrl-C instead of the ``n``-th SFT step (1-based) of this process."""
    original, calls = Learner.sft_on, []

    def sft_on(self, trajectories):
        calls.append(1)
        if len(calls) == n:
            raise Killed
        return original(self, trajectories)

    monkeypatch.setattr(Learner, "sft_on", sft_on)


def count_evaluations(monkeypatch):
    """The phases evaluated from here on (computed, not reused)."""
    original, phases = Evaluator.evaluate, []

    def evaluate(self, phase, weights, version):
        phases.append(phase)
        return original(self, phase, weights, version)

    monkeypatch.setattr(Evaluator, "evaluate", evaluate)
    return phases


def outputs(run_dir):
    """What a run computes: metrics, SFT losses, evaluations and the warm-started weights."""
    files = ["metrics.jsonl", "sft.jsonl", "eval/init.json", "eval/before_rl.json",
             "eval/after_rl.json"]
    out = {name: (run_dir / name).read_text() for name in files}
    out.update({str(p.relative_to(run_dir)): p.read_bytes()
                for p in sorted((run_dir / "sft_model").iterdir())})
    return out


def _saved_total_s(folder):
    """The run's wall seconds saved with its newest warm-start checkpoint."""
    newest = max((p for p in folder.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    return json.loads((newest / "data_state" / "metadata").read_text())["phases"]["wall"]["total_s"]


@pytest.fixture(scope="module")
def uninterrupted(small_model_dir, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("whole") / "run"
    assert cli.main(args(small_model_dir, run_dir)) == 0
    return outputs(run_dir)


def test_a_finished_warm_start_only_run_keeps_no_warm_start_checkpoints(small_model_dir,
                                                                        tmp_path):
    """``--rl_steps 0`` (a warm start made for other runs) has no RL checkpoint to take
    over: its warm-start checkpoints go when it finishes; its sft_model stays."""
    run_dir = tmp_path / "run"
    assert cli.main(args(small_model_dir, run_dir, "--rl_steps", "0")) == 0
    assert not (run_dir / "sft_checkpoints").exists()
    assert (run_dir / "sft_model" / "config.json").is_file()


def test_a_kill_during_sft_resumes_bit_for_bit_reusing_the_initial_evaluation(
        small_model_dir, tmp_path, capsys, monkeypatch, uninterrupted):
    run_dir = tmp_path / "run"
    argv = args(small_model_dir, run_dir)
    kill_at_sft_call(monkeypatch, 6)  # steps 0..4 done, checkpoints after steps 2 and 4
    assert cli.main(argv) == 130
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == (
        f"entr-run: interrupted; no RL checkpoint yet; a resume reuses {run_dir}/eval/init.json, "
        f"{run_dir}/sft_checkpoints/4; resume with: " + " ".join(["entr-run", *argv, "--resume"]))
    assert [json.loads(x)["step"] for x in (run_dir / "sft.jsonl").read_text().splitlines()
            ] == [0, 1, 2, 3]
    assert cli.main(argv) == 2  # a run is here: never overwritten without --resume
    assert "already holds a run: pass --resume" in capsys.readouterr().err

    monkeypatch.undo()
    first_total_s = _saved_total_s(run_dir / "sft_checkpoints")
    evaluated = count_evaluations(monkeypatch)
    assert cli.main([*argv, "--resume"]) == 0
    err = capsys.readouterr().err
    assert f"entr-run: no RL checkpoint in {run_dir} yet: reusing the phases it finished" in err
    assert f"entr-run: reusing the finished evaluation {run_dir}/eval/init.json" in err
    assert "entr-run: continuing the warm start at SFT step 4 from " in err
    assert evaluated == ["before_rl", "after_rl"]  # the initial evaluation was not redone
    assert outputs(run_dir) == uninterrupted
    # the time figures continue the first session's up to its checkpoint (4 SFT steps)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["time/counts"]["sft_steps"] == 6
    assert summary["wall_clock_s"] == summary["time/phases"]["total_s"] > first_total_s
    assert not (run_dir / "sft_checkpoints").exists()  # RL's checkpoint supersedes them


def test_a_kill_after_the_warm_start_reuses_it_and_both_evaluations(
        small_model_dir, tmp_path, capsys, monkeypatch, uninterrupted):
    run_dir = tmp_path / "run"
    argv = args(small_model_dir, run_dir)
    with_job_options(monkeypatch, hooks=[crash_at(0, Killed)])  # after the evaluation before RL
    assert cli.main(argv) == 130
    monkeypatch.undo()
    calls = []
    monkeypatch.setattr(Learner, "sft_on", lambda self, t: calls.append(1))
    evaluated = count_evaluations(monkeypatch)
    assert cli.main([*argv, "--resume"]) == 0
    assert calls == [] and evaluated == ["after_rl"]  # the sampler still serves the SFT weights
    assert "reusing the finished warm start (6 SFT steps) from " in capsys.readouterr().err
    assert outputs(run_dir) == uninterrupted


def test_lost_sft_lines_fall_back_to_the_older_checkpoint(small_model_dir, tmp_path, capsys,
                                                          monkeypatch, uninterrupted):
    run_dir = tmp_path / "run"
    argv = args(small_model_dir, run_dir)
    kill_at_sft_call(monkeypatch, 6)
    assert cli.main(argv) == 130
    lines = (run_dir / "sft.jsonl").read_text().splitlines()
    (run_dir / "sft.jsonl").write_text("\n".join(lines[:3]) + "\n")  # step 3's line lost
    monkeypatch.undo()
    with pytest.warns(CheckpointFallbackWarning, match="holds SFT steps 0 .. 2 in order"):
        assert cli.main([*argv, "--resume"]) == 0
    assert "continuing the warm start at SFT step 2 from " in capsys.readouterr().err
    assert outputs(run_dir) == uninterrupted


def test_unrestorable_warm_start_checkpoints_are_set_aside_and_it_starts_over(
        small_model_dir, tmp_path, capsys, monkeypatch, uninterrupted):
    """The warm start is a function of the configuration: when none of its checkpoints
    restores, it is redone with a one-line warning (the damaged ones kept aside), not a
    resume that stops until the user deletes them."""
    run_dir = tmp_path / "run"
    argv = args(small_model_dir, run_dir)
    kill_at_sft_call(monkeypatch, 6)
    assert cli.main(argv) == 130
    (run_dir / "sft.jsonl").write_text("")  # neither checkpoint's steps are on file
    monkeypatch.undo()
    with pytest.warns(CheckpointFallbackWarning) as caught:
        assert cli.main([*argv, "--resume"]) == 0
    (fallback,) = [w for w in caught if w.category is CheckpointFallbackWarning
                   and "warm start starts over" in str(w.message)]
    assert str(fallback.message) == (
        f"no warm-start checkpoint in {run_dir}/sft_checkpoints can be restored (the newest: "
        f"RunError: {run_dir}/sft.jsonl holds SFT steps 0 .. -1 in order, the checkpoint has "
        f"done SFT steps 0 .. 3; details: {run_dir}/logs/checkpoint.log): moved to "
        f"{run_dir}/sft_checkpoints_unrestorable; the warm start starts over at step 0")
    assert sorted(p.name for p in (run_dir / "sft_checkpoints_unrestorable").iterdir()) == ["2", "4"]
    assert outputs(run_dir) == uninterrupted


def test_a_changed_configuration_starts_the_warm_start_over(small_model_dir, tmp_path, capsys,
                                                            monkeypatch):
    run_dir = tmp_path / "run"
    argv = args(small_model_dir, run_dir)
    kill_at_sft_call(monkeypatch, 6)
    assert cli.main(argv) == 130
    monkeypatch.undo()
    evaluated = count_evaluations(monkeypatch)
    assert cli.main([*argv, "--resume", "--resume-override", "--sft.learning_rate", "0.002"]) == 0
    err = capsys.readouterr().err
    assert (f"entr-run: no RL checkpoint in {run_dir} yet: starting over with the new "
            f"sft.learning_rate (redoing {run_dir}/eval/init.json, {run_dir}/sft_checkpoints/4)"
            ) in err
    assert "continuing the warm start" not in err
    (record,) = [json.loads(x) for x in (run_dir / "resume_overrides.jsonl").read_text().splitlines()]
    assert record["from_step"] == 0 and record["changes"] == [
        {"field": "sft.learning_rate", "old": 0.001, "new": 0.002, "override": True}]
    assert evaluated == ["init", "before_rl", "after_rl"]
    assert [json.loads(x)["step"] for x in (run_dir / "sft.jsonl").read_text().splitlines()
            ] == list(range(6))
