"""Run-directory files under damage: whole-line JSONL appends, partial-line readers, atomic
JSON and parameter-ring writes on a full disk, ring checks, TensorBoard purge on resume,
the resume policy's decisions, sweep failure reports."""

import errno
import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

from tests.tb_events import read_events

from entr_jax.staleness import ParamRing
from experiments.run import jsonl, resume, state_io
from experiments.multirun import sweep
from experiments.run.errors import ResumeRefused, describe
from experiments.run.rundir import RunDir


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


# ---------------------------------------------------------------- JSONL

def test_append_line_writes_whole_lines_and_undoes_a_short_write(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    jsonl.append_line(path, {"step": 0, "loss": 0.5})
    before = path.read_bytes()
    assert before == b'{"step": 0, "loss": 0.5}\n'
    real_write = os.write

    def short_write(fd, data):  # the disk fills up after 7 bytes
        return real_write(fd, data[:7])

    monkeypatch.setattr(jsonl.os, "write", short_write)
    with pytest.raises(OSError) as exc:
        jsonl.append_line(path, {"step": 1, "loss": 0.25})
    assert exc.value.errno == errno.ENOSPC and exc.value.filename == str(path)
    assert path.read_bytes() == before  # the 7 bytes were truncated away
    assert describe(exc.value) == (f"No space left on device (short write): {path} (the disk "
                                   "is full)")


def test_readers_drop_a_partial_last_line_with_a_warning(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0}\n{"step": 1}\n{"step": 2, "lo')
    with pytest.warns(jsonl.PartialLineWarning, match=r"metrics.jsonl:3: dropped a partial last line \(15 characters"):
        assert jsonl.read_records(path) == [{"step": 0}, {"step": 1}]
    # the notebooks' reader too
    from experiments.analysis import load_run

    (tmp_path / "config.json").write_text(json.dumps({"seed": 0}))
    with pytest.warns(jsonl.PartialLineWarning):
        run = load_run(tmp_path)
    assert [r["step"] for r in run.metrics] == [0, 1]


def test_a_damaged_line_that_is_not_the_last_is_an_error_naming_it(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0}\n{"step": 1\n{"step": 2}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: invalid JSON"):
        jsonl.read_records(path)


def test_truncate_on_resume_drops_later_steps_and_the_partial_line(tmp_path):
    run = RunDir(tmp_path)
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in range(5)) + '{"step": 5,')
    with pytest.warns(jsonl.PartialLineWarning):
        run.truncate_jsonl("metrics.jsonl", 3)
    assert path.read_text() == '{"step": 0}\n{"step": 1}\n{"step": 2}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]  # no .tmp left


def test_write_json_on_a_full_disk_leaves_nothing(tmp_path, monkeypatch):
    run = RunDir(tmp_path)
    run.write_json("summary.json", {"a": 1})
    monkeypatch.setattr("experiments.run.rundir.os.fsync", _enospc)
    with pytest.raises(OSError) as exc:
        run.write_json("summary.json", {"a": 2})
    assert exc.value.filename == str(tmp_path / "summary.json")
    assert json.loads((tmp_path / "summary.json").read_text()) == {"a": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


# ---------------------------------------------------------------- parameter ring

def _ring():
    ring = ParamRing(2)
    ring.push(3, {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones(3)})
    ring.push(4, {"w": jnp.arange(6.0).reshape(2, 3) + 1, "b": jnp.zeros(3)})
    return ring


def test_ring_round_trip_and_record(tmp_path):
    path = tmp_path / "ring" / "4.npz"
    record = state_io.save_ring(path, _ring())
    assert record == {"file": "4.npz", "bytes": path.stat().st_size, "versions": [3, 4]}
    ring = state_io.load_ring(path, 2, template={"w": 0, "b": 0}, expect=record)
    assert ring.versions == [3, 4]
    np.testing.assert_array_equal(ring.get(4)["w"], np.arange(6.0).reshape(2, 3) + 1)
    np.testing.assert_array_equal(ring.get(3)["b"], np.ones(3))


def test_bfloat16_ring_round_trips_bit_for_bit(tmp_path):
    # .npy has no bfloat16 (it stores raw "V2" records): a bf16 policy's ring could not be
    # read back, so every checkpoint of a bf16 run was refused on resume (found by the
    # full-size rehearsal, benchmarks/rehearsal.py)
    w = jnp.array([[1.0, -2.5, 3.0e-3], [65504.0, 1.0e-20, -0.0]], jnp.bfloat16)
    ring = ParamRing(2)
    ring.push(3, {"w": w, "b": jnp.array([0.5, 7.0, -1.0], jnp.float32)})
    ring.push(4, {"w": w + jnp.bfloat16(1), "b": jnp.zeros(3, jnp.float32)})
    path = tmp_path / "4.npz"
    record = state_io.save_ring(path, ring)
    back = state_io.load_ring(path, 2, template={"w": 0, "b": 0}, expect=record)
    assert back.versions == [3, 4]
    for v in (3, 4):
        assert back.get(v)["w"].dtype == jnp.bfloat16 and back.get(v)["b"].dtype == jnp.float32
        np.testing.assert_array_equal(np.asarray(back.get(v)["w"]).view(np.uint16),
                                      np.asarray(ring.get(v)["w"]).view(np.uint16))
        np.testing.assert_array_equal(back.get(v)["b"], ring.get(v)["b"])
    assert float(back.get(4)["w"][0, 1]) == -1.5


def test_ring_write_on_a_full_disk_leaves_no_partial_file(tmp_path, monkeypatch):
    path = tmp_path / "ring" / "4.npz"

    def savez_then_fail(f, **arrays):
        f.write(b"PK\x03\x04 partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(state_io.np, "savez", savez_then_fail)
    with pytest.raises(OSError) as exc:
        state_io.save_ring(path, _ring())
    assert exc.value.filename == str(path)
    assert list((tmp_path / "ring").iterdir()) == []


@pytest.mark.parametrize("damage, message", [
    ("truncate", "has {n} bytes, its checkpoint recorded {m} (truncated or replaced)"),
    ("delete", "is missing"),
    ("flip", "cannot be read (BadZipFile: Bad CRC-32"),
])
def test_a_damaged_ring_file_is_refused_in_one_line(tmp_path, damage, message):
    path = tmp_path / "4.npz"
    record = state_io.save_ring(path, _ring())
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[:len(data) // 2])
    elif damage == "delete":
        path.unlink()
    else:  # one bit of the last array's data, same size: only the zip CRC can tell
        i = data.rindex(b"\x00\x00\x80?")  # a float32 1.0 of "b" in version 3 ... or 4's w
        path.write_bytes(data[:i] + b"\x01" + data[i + 1:])
    with pytest.raises(state_io.RingFileError) as exc:
        state_io.load_ring(path, 2, template={"w": 0, "b": 0}, expect=record)
    text = str(exc.value)
    assert "\n" not in text and text.startswith(f"parameter ring {path} ")
    assert message.format(n=len(data) // 2, m=len(data)) in text


def test_prune_keeps_checkpoint_rings_and_removes_temporaries(tmp_path):
    for name in ("2.npz", "4.npz", "6.npz", "8.npz.tmp", "notes.txt"):
        (tmp_path / name).write_bytes(b"x")
    state_io.prune_rings(tmp_path, [4, 6])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["4.npz", "6.npz", "notes.txt"]


# ---------------------------------------------------------------- TensorBoard

def _events(path):
    return read_events(path)


def test_a_resumed_logger_purges_the_steps_it_rewrites(tmp_path):
    from learners.logging import MetricsLogger

    first = MetricsLogger(tmp_path, jsonl=False)
    for step in range(4):
        first.log(step, step, {"loss": float(step)})
    first.close()
    resumed = MetricsLogger(tmp_path, jsonl=False, purge_step=2)
    for step in (2, 3):
        resumed.log(step, step, {"loss": 10.0 + step})
    resumed.close()
    files = sorted(tmp_path.glob("events.out.tfevents.*"))  # the order TensorBoard reads
    assert len(files) == 2
    ev = _events(files[1])
    starts = [e.step for e in ev if e.HasField("session_log") and e.session_log.status == 1]
    assert starts == [2]  # SessionLog.START at the purge step: TensorBoard drops steps >= 2
    loss = [(e.step, e.summary.value[0].simple_value) for e in ev
            if e.HasField("summary") and e.summary.value[0].tag == "loss"]
    assert loss == [(2, 12.0), (3, 13.0)]


# ---------------------------------------------------------------- resume policy

def test_config_changes_are_dotted_and_classified():
    saved = {"name": "a", "objective": {"name": "entr"}, "checkpoint": {"keep": 2, "every": 5},
             "optim": {"learning_rate": 1e-4}}
    new = {"name": "b", "objective": {"name": "grpo"}, "checkpoint": {"keep": 3, "every": 5},
           "optim": {"learning_rate": 1e-4}, "extra": {"field": 1}}
    changes = resume.config_changes(saved, new)
    assert [str(c) for c in changes] == ['checkpoint.keep: 2 -> 3', 'extra.field: "<absent>" -> 1',
                                         'name: "a" -> "b"', 'objective.name: "entr" -> "grpo"']
    assert [c.neutral for c in changes] == [True, False, True, False]
    # W&B logging is neutral as a section; a field merely named like it is not
    logging = resume.config_changes({"logging": {"wandb": True, "wandb_mode": "offline"},
                                     "loggingx": 1},
                                    {"logging": {"wandb": False, "wandb_mode": "online"},
                                     "loggingx": 2})
    assert [(c.field, c.neutral) for c in logging] == [
        ("logging.wandb", True), ("logging.wandb_mode", True), ("loggingx", False)]


def test_plan_resume_fresh_continue_refuse_finished(tmp_path):
    run = RunDir(tmp_path / "run")
    saved = {"objective": {"name": "entr"}, "checkpoint": {"keep": 2}}
    with pytest.raises(ResumeRefused) as exc:  # nothing there: a typo, not a run to start
        resume.plan_resume(run, json.dumps(saved))
    assert str(exc.value) == (
        f"nothing to resume at {tmp_path}/run: it holds no run (no config.json, metrics.jsonl, "
        "checkpoint or summary.json); drop --resume to start a run there, or give the "
        "--run_dir of the run to continue")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text(json.dumps(saved))  # started, then killed
    assert resume.plan_resume(run, json.dumps(saved)).action == "fresh"
    (tmp_path / "run" / "checkpoints" / "4").mkdir(parents=True)
    plan = resume.plan_resume(run, json.dumps(dict(saved, checkpoint={"keep": 5})))
    assert (plan.action, [c.field for c in plan.changes], plan.overrides) == (
        "continue", ["checkpoint.keep"], ())
    changed = json.dumps({"objective": {"name": "grpo"}, "checkpoint": {"keep": 2}})
    with pytest.raises(ResumeRefused) as exc:
        resume.plan_resume(run, changed)
    assert str(exc.value) == (
        f"cannot resume {tmp_path}/run: the configuration differs from the saved one in 1 "
        'field(s) that change the experiment: objective.name: "entr" -> "grpo". Resume with '
        "the saved values, choose a new --run_dir, or pass --resume-override to continue "
        "with the new values (recorded in resume_overrides.jsonl)")
    plan = resume.plan_resume(run, changed, override=True)
    assert [c.field for c in plan.overrides] == ["objective.name"]
    resume.record_changes(run, plan, 4)
    rec = json.loads((tmp_path / "run" / "resume_overrides.jsonl").read_text())
    assert rec["from_step"] == 4 and rec["changes"] == [
        {"field": "objective.name", "old": "entr", "new": "grpo", "override": True}]
    (tmp_path / "run" / "summary.json").write_text("{}")
    assert resume.plan_resume(run, json.dumps(saved)).action == "finished"
    with pytest.raises(ResumeRefused, match="is a finished run .* objective.name: \"entr\" -> "
                                            "\"grpo\". Its summary belongs to the saved"):
        resume.plan_resume(run, changed, override=True)


def test_a_saved_config_that_predates_a_field_reads_as_its_default(tmp_path):
    """A run written before a field existed (its config.json lacks it) ran with the field's
    default: resuming it with the default is no change, with another value the change is
    named from the default (this refused every run stored before sampler.num_devices)."""
    from experiments.run.config import with_field_defaults
    from experiments.run.configs import PRESETS

    preset = json.loads(PRESETS["quickstart"][1].to_json())
    saved = json.loads(json.dumps(preset))
    del saved["sampler"]["num_devices"]
    saved["extra"] = {"field": 1}  # a field this version does not know stays as written
    filled = with_field_defaults(saved)
    assert filled["sampler"]["num_devices"] == 1 and filled["extra"] == {"field": 1}
    assert "num_devices" not in saved["sampler"]  # the input is not modified
    del saved["extra"]
    run = RunDir(tmp_path / "run")
    (tmp_path / "run" / "checkpoints" / "3").mkdir(parents=True)
    (tmp_path / "run" / "config.json").write_text(json.dumps(saved))
    plan = resume.plan_resume(run, json.dumps(preset))
    assert (plan.action, plan.changes) == ("continue", ())
    more = json.loads(json.dumps(preset))
    more["sampler"]["num_devices"] = 2
    with pytest.raises(ResumeRefused, match=r"in 1 field\(s\) that change the experiment: "
                                            r"sampler.num_devices: 1 -> 2\. "):
        resume.plan_resume(run, json.dumps(more))
    # a sweep's reuse identity reads it the same way
    assert sweep._identity(saved) == sweep._identity(preset)
    assert sweep._identity(saved) != sweep._identity(more)


# ---------------------------------------------------------------- sweeps

def test_a_failed_sweep_cell_reports_its_last_error_line_and_log(tmp_path, monkeypatch):
    spec = {"preset": "quickstart", "seeds": [0], "grid": [{"rl_steps": [3]}], "fixed": {}}
    log_text = ("RL (entr):  40%|####      | 2/5 [00:01<00:02, 1.5it/s]\r"
                "entr-run: error: task.max_total_tokens must be >= task.max_new_tokens (12)\n")

    class Done:
        returncode = 2

    def fake_run(cmd, stdout, stderr, env):
        stdout.write(log_text)
        return Done()

    monkeypatch.setattr(sweep.subprocess, "run", fake_run)
    (rec,) = sweep.run_local(spec, tmp_path)
    log = tmp_path / "rl_steps=3_seed=0" / "sweep.log"
    assert rec.pop("wall_s") >= 0
    assert rec == {"name": "rl_steps=3_seed=0", "status": "rc=2", "log": str(log),
                   "error": "entr-run: error: task.max_total_tokens must be >= "
                            "task.max_new_tokens (12)"}


def test_last_error_line_falls_back_to_a_traceback_last_line(tmp_path):
    log = tmp_path / "sweep.log"
    log.write_text("Traceback (most recent call last):\n  File x\nZeroDivisionError: boom\n"
                   "SFT warm start: 100%|##| 5/5 [00:01<00:00, 4.1it/s]\n")
    assert sweep.last_error_line(log) == "ZeroDivisionError: boom"


def test_fixed_staleness_fields_go_only_to_runs_whose_mode_reads_them(tmp_path):
    spec = {"preset": "quickstart", "seeds": [0],
            "grid": [{"staleness.mode": ["simulated", "sync", "async"]}],
            "fixed": {"staleness.inter_lag": 5, "staleness.max_staleness": 1, "rl_steps": 3}}
    runs = {r.overrides["staleness.mode"]: r.overrides for r in sweep.expand(spec, tmp_path)}
    assert runs["simulated"] == {"staleness.inter_lag": 5, "rl_steps": 3,
                                 "staleness.mode": "simulated", "seed": 0}
    assert runs["sync"] == {"rl_steps": 3, "staleness.mode": "sync", "seed": 0}
    assert runs["async"] == {"staleness.max_staleness": 1, "rl_steps": 3,
                             "staleness.mode": "async", "seed": 0}


def test_boolean_overrides_become_tyro_flags(tmp_path):
    from experiments.run import cli

    spec = {"preset": "quickstart", "seeds": [0], "fixed": {},
            "grid": [{"sft.save_model": [False, True], "advantages.batch_normalize": [True]}]}
    cmds = [r.command("quickstart") for r in sweep.expand(spec, tmp_path)]
    assert cmds[0][-4:] == ["--sft.no_save_model", "--advantages.batch_normalize", "--seed", "0"]
    assert cmds[1][-4:] == ["--sft.save_model", "--advantages.batch_normalize", "--seed", "0"]
    cfgs = [cli.parse(c[3:])[0] for c in cmds]
    assert [(c.sft.save_model, c.advantages.batch_normalize) for c in cfgs] == [(False, True),
                                                                              (True, True)]
