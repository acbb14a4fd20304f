"""Resume through the real CLI on one small finished run (module fixture), copied and
damaged per test: config changes refused or recorded, finished runs, a truncated
parameter ring and a partial metrics line falling back bit for bit, both checkpoints
damaged, TensorBoard purge and eval/SFT curves (the SFT one is slow)."""

import json
import re
import shutil

import pytest

from tests.small_job import crash_at, small_argv, with_job_options
from tests.tb_events import read_events

from experiments.run import build
from experiments.run import cli
from experiments.run.jsonl import PartialLineWarning
from learners.checkpoint import CheckpointFallbackWarning


@pytest.fixture(scope="module")
def model_dir(small_model_dir):
    """A 2-layer Qwen2 checkpoint with the embedded tokenizer (conftest's)."""
    return small_model_dir


def args(model_dir, run_dir, *extra):
    """No SFT, 4 RL steps of 2 prompts x 3 samples (`tests.small_job.small_argv`)."""
    return small_argv(model_dir, run_dir, "--sft.steps", "0", "--sft.no_save_model",
                      "--rl_steps", "4", "--task.samples_per_prompt", "3",
                      "--task.max_new_tokens", "6", "--task.max_total_tokens", "6", *extra)


def call(argv, capsys):
    code = cli.main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def finished(model_dir, tmp_path_factory):
    """One finished run: RL 4 steps, checkpoints at steps 2 and 4."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    assert cli.main(args(model_dir, run_dir)) == 0
    return run_dir


def killed_copy(finished, tmp_path, after_eval=False):
    """A copy of the finished run as if killed after its last checkpoint (before the final
    evaluation, or after it with ``after_eval``)."""
    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    (run_dir / "summary.json").unlink()
    if not after_eval:
        (run_dir / "eval" / "after_rl.json").unlink()
    return run_dir


def listing(root):
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}


def test_finished_run_resumed_with_its_config_says_so(finished, model_dir, capsys, monkeypatch,
                                                      recwarn):
    from experiments.run import preflight

    monkeypatch.setattr(preflight, "lag_horizon", lambda cfg: "a note on how it would run")
    before = listing(finished)
    code, out, err = call(args(model_dir, finished, "--resume", "--checkpoint.keep", "3"), capsys)
    assert code == 0
    assert (f"entr-run: {finished} already finished (summary.json): nothing to resume; "
            "showing its summary") in err
    # nothing runs: no warning about how it would run
    assert not [w for w in recwarn if "a note on how it would run" in str(w.message)]
    summary = json.loads((finished / "summary.json").read_text())
    assert json.loads(out[:out.rindex("}") + 1])["eval_accuracy_after"] == summary["eval_accuracy_after"]
    assert listing(finished) == {**before, "logs/run.log": listing(finished)["logs/run.log"]}


def test_finished_run_resumed_with_a_new_config_is_refused(finished, model_dir, capsys):
    code, out, err = call(args(model_dir, finished, "--resume", "--resume-override",
                               "--objective.name", "grpo"), capsys)
    assert code == 2 and out == ""
    assert err == (f"entr-run: error: {finished} is a finished run (summary.json) and its "
                   'configuration differs: objective.name: "entr" -> "grpo". Its summary '
                   "belongs to the saved configuration; a finished run is not continued, even "
                   "with --resume-override: choose a new --run_dir\n")


def test_a_change_to_the_experiment_is_refused_before_any_work(finished, model_dir, tmp_path,
                                                               capsys):
    run_dir = killed_copy(finished, tmp_path)
    before = {k: (run_dir / k).read_bytes() for k in listing(run_dir)}
    code, _, err = call(args(model_dir, run_dir, "--resume", "--objective.name", "grpo",
                             "--optim.learning_rate", "0.001"), capsys)
    assert code == 2
    assert err == (f"entr-run: error: cannot resume {run_dir}: the configuration differs from "
                   "the saved one in 2 field(s) that change the experiment: objective.name: "
                   '"entr" -> "grpo"; optim.learning_rate: 0.0002 -> 0.001. Resume with the '
                   "saved values, choose a new --run_dir, or pass --resume-override to continue "
                   "with the new values (recorded in resume_overrides.jsonl)\n")
    assert {k: (run_dir / k).read_bytes() for k in listing(run_dir)} == before


def test_override_continues_and_records_the_change(finished, model_dir, tmp_path, capsys):
    run_dir = killed_copy(finished, tmp_path)
    code, out, err = call(args(model_dir, run_dir, "--resume", "--resume-override",
                               "--objective.name", "grpo", "--checkpoint.keep", "3"), capsys)
    assert code == 0, err
    assert re.search(
        re.escape(f"entr-run: resuming {run_dir} at RL step 4 (next batch id 4; data iterator "
                  "at batch ") + r"\d+" + re.escape(
            f") from checkpoint {run_dir / 'checkpoints' / '4'}; overriding objective.name\n"),
        err), err
    (record,) = [json.loads(x) for x in (run_dir / "resume_overrides.jsonl").read_text().splitlines()]
    assert record["from_step"] == 4
    assert record["changes"] == [  # the copy moved the run: run_dir may differ, too
        {"field": "checkpoint.keep", "old": 2, "new": 3, "override": False},
        {"field": "objective.name", "old": "entr", "new": "grpo", "override": True},
        {"field": "run_dir", "old": str(finished), "new": str(run_dir), "override": False}]
    assert json.loads((run_dir / "config.json").read_text())["objective"]["name"] == "grpo"
    assert json.loads((run_dir / "summary.json").read_text())["objective"] == "grpo"
    # steps 0-3 were trained as ENTR: the metrics are the original run's
    assert (run_dir / "metrics.jsonl").read_bytes() == (finished / "metrics.jsonl").read_bytes()


def _events(path):
    return read_events(path)


def _scalars(tb_dir):
    out = {}
    for f in sorted(tb_dir.glob("events.out.tfevents.*")):
        for e in _events(f):
            for v in e.summary.value:
                out.setdefault(v.tag, []).append((e.step, v.simple_value))
    return out


def test_truncated_ring_and_partial_metrics_line_fall_back_bit_for_bit(finished, model_dir,
                                                                      tmp_path, capsys):
    run_dir = killed_copy(finished, tmp_path)
    ring4 = run_dir / "ring" / "4.npz"
    size = ring4.stat().st_size
    ring4.write_bytes(ring4.read_bytes()[:size // 3])
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write('{"step": 4, "version": 4, "reward/me')  # a writer killed mid-line
    with pytest.warns(CheckpointFallbackWarning) as fallback:
        with pytest.warns(PartialLineWarning, match="metrics.jsonl:5: dropped a partial last line"):
            code, _, err = call(args(model_dir, run_dir, "--resume"), capsys)
    assert code == 0, err
    (w,) = [w for w in fallback if w.category is CheckpointFallbackWarning]
    assert str(w.message) == (
        f"checkpoint step 4 at {run_dir / 'checkpoints' / '4'} cannot be restored (RingFileError: "
        f"parameter ring {ring4} has {size // 3} bytes, its checkpoint recorded {size} (truncated "
        f"or replaced)); falling back to step 2 (details: {run_dir / 'logs' / 'checkpoint.log'})")
    assert f"entr-run: resuming {run_dir} at RL step 2 (next batch id 2; " in err
    assert f"from checkpoint {run_dir / 'checkpoints' / '2'}\n" in err
    # the resumed run redid steps 2 and 3 exactly
    assert (run_dir / "metrics.jsonl").read_bytes() == (finished / "metrics.jsonl").read_bytes()
    assert (run_dir / "checkpoints_unrestorable" / "4").is_dir()
    assert sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir()) == [2, 4]
    # TensorBoard: the resumed session purges steps >= 2 of the first one
    files = sorted((run_dir / "tb").glob("events.out.tfevents.*"))
    starts = [e.step for e in _events(files[-1])
              if e.HasField("session_log") and e.session_log.status == 1]
    assert starts == [2]
    assert [s for s, _ in _scalars(run_dir / "tb")["loss"]] == [0, 1, 2, 3, 2, 3]


def _lose_metrics_line(run_dir, cut):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [0, 1, 2, 3]
    (run_dir / "metrics.jsonl").write_text("\n".join(lines[:3]) + "\n" + lines[3][:cut])


def _drop_grain_state(run_dir):
    item = run_dir / "checkpoints" / "4" / "data_state" / "metadata"
    state = json.loads(item.read_text())
    del state["grain"]
    item.write_text(json.dumps(state))


_GAP = (r"MetricsGapError: .*metrics.jsonl holds steps 0 \.\. 2 in order, the checkpoint has "
        r"done steps 0 \.\. 3")


@pytest.mark.parametrize("damage, reason", [
    (lambda run_dir: _lose_metrics_line(run_dir, 0), _GAP),  # the line of step 3 missing
    # cut mid-line by a kill: reading it warns of the dropped partial line (that warning's
    # own test: tests/test_run_files.py)
    pytest.param(lambda run_dir: _lose_metrics_line(run_dir, 25), _GAP, marks=pytest.mark.filterwarnings(
        "ignore:.*dropped a partial last line:experiments.run.jsonl.PartialLineWarning")),
    (_drop_grain_state, r"ValueError: PromptBatchIterator.set_state: state lacks 'grain'"),
], ids=["missing_metrics_line", "partial_metrics_line", "data_state_without_grain"])
def test_a_lost_metrics_line_or_damaged_data_state_falls_back(finished, model_dir, tmp_path,
                                                              capsys, damage, reason):
    """Checkpoint 4 has done step 3, but metrics.jsonl lacks its line (removed, or cut
    mid-line), or its data position cannot be restored: the resume falls back to
    checkpoint 2 (as for damaged weights) and redoes steps 2 and 3, so metrics.jsonl has
    every step exactly once, bit for bit as the uninterrupted run's."""
    run_dir = killed_copy(finished, tmp_path)
    damage(run_dir)
    with pytest.warns(CheckpointFallbackWarning, match=(
            rf"checkpoint step 4 .* cannot be restored \({reason}\); falling back to step 2")):
        code, _, err = call(args(model_dir, run_dir, "--resume"), capsys)
    assert code == 0, err
    assert f"entr-run: resuming {run_dir} at RL step 2 " in err
    assert (run_dir / "metrics.jsonl").read_bytes() == (finished / "metrics.jsonl").read_bytes()


def test_both_checkpoints_damaged_is_one_line_and_loses_nothing(finished, model_dir, tmp_path,
                                                                capsys):
    run_dir = killed_copy(finished, tmp_path)
    for step in (2, 4):
        ring = run_dir / "ring" / f"{step}.npz"
        ring.write_bytes(ring.read_bytes()[:100])
    metrics = (run_dir / "metrics.jsonl").read_bytes()
    with pytest.warns(CheckpointFallbackWarning, match="checkpoint step 4 at"):
        code, _, err = call(args(model_dir, run_dir, "--resume"), capsys)
    assert code == 2
    assert re.fullmatch(
        f"entr-run: error: no checkpoint in {re.escape(str(run_dir / 'checkpoints'))} can be "
        r"restored \(tried steps 4, 2; the newest: RingFileError: [^\n]{1,180}\); details: "
        f"{re.escape(str(run_dir / 'logs' / 'checkpoint.log'))}. To start over, move "
        f"{re.escape(str(run_dir / 'checkpoints'))} away\n", err)
    assert (run_dir / "logs" / "checkpoint.log").read_text().count("RingFileError") >= 2
    assert (run_dir / "metrics.jsonl").read_bytes() == metrics
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["2", "4"]


@pytest.mark.parametrize("written", [
    ("config.json",),  # killed during the first evaluation
    ("config.json", "metrics.jsonl", "checkpoints/"),  # killed before the first checkpoint
])
def test_resume_without_a_checkpoint_says_it_starts_fresh(model_dir, tmp_path, capsys,
                                                          monkeypatch, written):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for name in written:
        if name.endswith("/"):
            (run_dir / name).mkdir()
        elif name == "config.json":  # the run's own configuration, as it wrote it
            (run_dir / name).write_text(cli.parse(args(model_dir, run_dir))[0].to_json())
        else:
            (run_dir / name).write_text("{}")

    class Stop(BaseException):
        pass

    def stop(*args):
        raise Stop  # stop right after the decision; nothing else runs

    monkeypatch.setattr(build, "prepare_task", stop)
    with pytest.raises(Stop):
        cli.main(args(model_dir, run_dir, "--resume"))
    err = capsys.readouterr().err
    assert err == f"entr-run: nothing to resume in {run_dir} (no checkpoint): starting fresh\n"


def test_a_changed_config_is_refused_even_before_the_first_checkpoint(model_dir, tmp_path,
                                                                     capsys, monkeypatch):
    """A run stopped before its first checkpoint starts over on --resume, in its own
    directory: with its own configuration; a change to the experiment is refused (nothing
    rewritten) unless --resume-override."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    saved = cli.parse(args(model_dir, run_dir))[0].to_json()
    (run_dir / "config.json").write_text(saved)
    (run_dir / "metrics.jsonl").write_text("")
    before = listing(run_dir)
    code, _, err = call(args(model_dir, run_dir, "--resume", "--seed", "7"), capsys)
    assert code == 2
    assert err.startswith(f"entr-run: error: cannot resume {run_dir}: it has no RL checkpoint yet")
    assert "seed: 0 -> 7" in err and "--resume-override" in err
    assert listing(run_dir) == before and (run_dir / "config.json").read_text() == saved

    class Stop(BaseException):
        pass

    def stop(*args):
        raise Stop  # stop right after the decision and what it records

    monkeypatch.setattr(build, "prepare_task", stop)
    with pytest.raises(Stop):
        cli.main(args(model_dir, run_dir, "--resume", "--resume-override", "--seed", "7"))
    assert capsys.readouterr().err == (f"entr-run: no RL checkpoint in {run_dir} yet: "
                                       "starting over with the new seed\n")


def test_ctrl_c_prints_one_line_with_what_is_saved_and_the_resume_command(model_dir, tmp_path,
                                                                          capsys, monkeypatch):
    """Ctrl-C (here during RL step 3, after the checkpoint of step 2) is one line on stderr,
    no traceback: what is saved and the command that resumes; exit status 130. Before
    the first checkpoint it says that nothing is saved yet."""
    with_job_options(monkeypatch, hooks=[crash_at(3)])
    run_dir = tmp_path / "run"
    argv = args(model_dir, run_dir)
    code, _, err = call(argv, capsys)
    command = " ".join(["entr-run", *argv, "--resume"])
    assert code == 130 and "Traceback" not in err
    assert err.splitlines()[-1] == (f"entr-run: interrupted; saved up to RL step 2 "
                                    f"({run_dir}/checkpoints/2); resume with: {command}")

    def ctrl_c(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(build, "prepare_task", ctrl_c)
    other = tmp_path / "other"
    code, _, err = call(args(model_dir, other), capsys)
    assert (code, err.splitlines()[-1]) == (130, (  # --resume would be refused: nothing there
        "entr-run: interrupted before the run wrote anything: nothing saved; start it again "
        "with: " + " ".join(["entr-run", *args(model_dir, other)])))


@pytest.mark.parametrize("sub", ["checkpoints", "ring"])
def test_a_file_where_the_run_keeps_a_directory_is_refused_before_work(model_dir, tmp_path,
                                                                       capsys, sub):
    """A file in place of the checkpoint (or ring) directory is refused before any work,
    naming it; it used to fail at the first save in orbax's thread and then hang forever
    waiting on that thread."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / sub).write_text("")
    code, _, err = call(args(model_dir, run_dir), capsys)
    assert (code, err) == (2, f"entr-run: error: run_dir {run_dir}: {run_dir / sub} exists and "
                              f"is not a directory (the run keeps its {sub} there); move it "
                              "away or choose another --run_dir\n")
    assert sorted(p.name for p in run_dir.iterdir()) == [sub]


def test_tensorboard_has_eval_curves(finished):
    scalars = _scalars(finished / "tb")
    evals = {p: json.loads((finished / "eval" / f"{p}.json").read_text())["benchmarks"]["arithmetic"]
             for p in ("init", "before_rl", "after_rl")}
    for phase, step in (("init", 0), ("before_rl", 0), ("after_rl", 4)):
        m = evals[phase]
        assert scalars[f"eval/{phase}/arithmetic/avg_at_1"] == [(step, pytest.approx(m["avg@n"]))]
        assert scalars[f"eval/{phase}/arithmetic/pass_at_1"] == [(step, pytest.approx(m["pass@1"]))]
        assert scalars[f"eval/{phase}/arithmetic/greedy"] == [(step, pytest.approx(m["greedy"]))]


@pytest.mark.slow
def test_tensorboard_has_the_sft_loss_curve(model_dir, tmp_path):
    run_dir = tmp_path / "sft"
    assert cli.main(args(model_dir, run_dir, "--sft.steps", "3", "--rl_steps", "0")) == 0
    sft = [json.loads(x) for x in (run_dir / "sft.jsonl").read_text().splitlines()]
    assert [r["step"] for r in sft] == [0, 1, 2]
    assert _scalars(run_dir / "tb" / "sft")["sft/loss"] == [
        (r["step"], pytest.approx(r["loss"])) for r in sft]
    assert "sft/loss" not in _scalars(run_dir / "tb")  # its own run: RL resumes purge tb/


def test_an_existing_run_needs_resume(finished, model_dir, capsys):
    code, _, err = call(args(model_dir, finished), capsys)
    assert (code, err) == (2, f"entr-run: error: {finished} already holds a run: pass --resume "
                              "to continue it, or choose another --run_dir\n")


def test_a_finished_run_without_rl_steps_is_not_overwritten(tmp_path, model_dir, capsys):
    """A warm-start-only run (``--rl_steps 0``, like runs/sft_base) has no metrics or
    checkpoints, only summary.json: running into it again needs --resume too."""
    run_dir = tmp_path / "sft_base"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text("{}")
    code, _, err = call(args(model_dir, run_dir, "--rl_steps", "0"), capsys)
    assert (code, err) == (2, f"entr-run: error: {run_dir} already holds a run: pass --resume "
                              "to continue it, or choose another --run_dir\n")


def test_the_fleets_timeouts_and_key_reference_may_change_on_resume():
    """Neither how long the fleet waits nor where its key is read from changes what a run
    computes (same weights, same requests): a resume may change them; the sampler kind not."""
    from experiments.run.resume import Change

    assert Change("sampler.fleet.outage_wait_s", 900.0, 1800.0).neutral
    assert Change("sampler.api_key", "env:A", "file:/k").neutral
    assert not Change("sampler.kind", "jax", "sglang").neutral
