"""Checkpoints: bitwise resume, keep-last-N, corrupt-newest fallback, sharded restore."""

import json
import shutil

import jax
import numpy as np
import pytest
from flax import nnx

from entr_jax.model import Decoder, ModelConfig
from entr_jax.objectives import make_objective
from entr_jax.sharding import MeshConfig
from learners.checkpoint import (CheckpointFallbackWarning, CheckpointManager,
                                  CheckpointRestoreError)
from learners.learner import Learner, LearnerConfig, NonFiniteError
from learners.logging import DeferredMetrics
from learners.optim import OptimizerConfig

CFG = ModelConfig(
    architecture="llama", vocab_size=24, hidden_size=16, intermediate_size=32, num_layers=1,
    num_heads=2, num_kv_heads=2, head_dim=8,
)


@pytest.fixture(scope="module")
def batches(random_trajectories):
    """Four rollout batches of 8 episodes, batch k drawn with seed k at version k."""
    return [random_trajectories(8, k, prompt_len=(1, 4), response_len=(1, 6), scale=2.0,
                                version=k, keep=None) for k in range(4)]


@pytest.fixture
def learner(tmp_path):
    """A fresh learner per test, with its own checkpoint and log directories: no test
    depends on another's checkpoints or steps, so any order or split across workers holds."""
    root = tmp_path / "learner"
    config = LearnerConfig(
        mesh=MeshConfig(data=2, fsdp=4), optimizer=OptimizerConfig(learning_rate=1e-2, warmup_steps=1),
        microbatches=2, logprob_chunk=8, max_bad_steps=2,
    )
    ckpt = CheckpointManager(root / "ckpt", max_to_keep=2)
    lrn = Learner(lambda: Decoder(CFG, rngs=nnx.Rngs(0)), config,
                  objective=make_objective("entr"), logdir=root / "logs", checkpoint=ckpt)
    yield lrn, root
    lrn.close()


def _run(lrn, batches):
    out = [lrn.train_on(*b) for b in batches]
    out.append(lrn.flush())
    return [m for m in out if m is not None]


def test_resume_is_bitwise_identical(learner, batches):
    lrn, root = learner
    first = _run(lrn, batches[:2])
    assert lrn.save(data_state={"epoch": 0, "index": 2}, queue_state={"pending": []},
                    config={"lr": 1e-2})
    rest = _run(lrn, batches[2:])
    params_uninterrupted = jax.device_get(lrn.state.params)
    assert int(lrn.state.version) == 4

    items = lrn.restore_latest()  # "crash": throw the live state away, resume from disk
    assert items["data_state"] == {"epoch": 0, "index": 2} and items["step"] == 2
    assert int(lrn.state.step) == 2 and int(lrn.state.version) == 2
    emb = lrn.state.params["embed_tokens"]["embedding"].get_value()
    assert emb.sharding == lrn.shardings.params["embed_tokens"]["embedding"].get_value()
    resumed = _run(lrn, batches[2:])
    for a, b in zip(jax.tree.leaves(params_uninterrupted), jax.tree.leaves(lrn.state.params)):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(rest, resumed):
        assert set(a) == set(b)
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    assert len(first) == 2 and first[0]["train/version"] == 1.0
    lines = (root / "logs" / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["step"] == 0 and json.loads(lines[-1])["version"] == 4
    assert lrn.rl_step.num_traces == 1


def test_corrupt_newest_falls_back_and_keep_last_n(learner, batches):
    lrn, root = learner
    ckpt = lrn.checkpoint
    for k in range(3):  # steps 1, 2, 3 saved; max_to_keep=2 keeps 2 and 3
        _run(lrn, batches[k:k + 1])
        lrn.save(data_state={"k": k})
        ckpt.wait()
    assert ckpt.all_steps() == [2, 3]
    # a crashed save leaves only an orbax temporary directory: never listed as a step
    (root / "ckpt" / "4.orbax-checkpoint-tmp-123").mkdir()
    # corrupt the newest: delete every array data file of its params item
    data_files = [p for p in (root / "ckpt" / "3" / "params").rglob("*")
                  if p.is_file() and p.parent.name == "d"]
    assert data_files
    for p in data_files:
        p.unlink()
    with pytest.warns(CheckpointFallbackWarning) as caught:
        items = lrn.restore_latest()
    assert items["step"] == 2 and items["data_state"] == {"k": 1}
    assert items["path"] == str(root / "ckpt" / "2")
    assert int(lrn.state.step) == 2
    # one line with the path; the orbax error in full goes to the log
    (w,) = caught
    text = str(w.message)
    # the error's first line is cut at 400 characters; the rest is two paths
    assert "\n" not in text and len(text) < 500 + 2 * len(str(root / "ckpt_restore.log"))
    assert text.startswith(f"checkpoint step 3 at {root / 'ckpt' / '3'} cannot be restored (")
    assert text.endswith(f"); falling back to step 2 (details: {root / 'ckpt_restore.log'})")
    assert "Traceback (most recent call last)" in (root / "ckpt_restore.log").read_text()
    # the unrestorable step is kept aside, so orbax can save step 3 again
    assert (root / "ckpt_unrestorable" / "3" / "params").is_dir()
    assert ckpt.all_steps() == [2]
    _run(lrn, batches[2:3])
    assert lrn.save(data_state={"k": 2})
    ckpt.wait()
    assert ckpt.all_steps() == [2, 3]
    shutil.rmtree(root / "ckpt" / "4.orbax-checkpoint-tmp-123")


def test_no_restorable_checkpoint_is_one_line_naming_the_log(learner, tmp_path, batches):
    lrn, root = learner
    for k in range(2):  # steps 1 and 2 saved
        _run(lrn, batches[k:k + 1])
        assert lrn.save(data_state={"k": k})
    lrn.checkpoint.wait()
    shutil.copytree(root / "ckpt", tmp_path / "ckpt")
    for p in (tmp_path / "ckpt").rglob("*"):
        if p.is_file() and p.parent.name == "d":
            p.unlink()
    log = tmp_path / "logs" / "checkpoint.log"
    mgr = CheckpointManager(tmp_path / "ckpt", max_to_keep=2, log_file=log)
    steps = mgr.all_steps()
    assert steps == [1, 2]
    with pytest.warns(CheckpointFallbackWarning, match="step 2 at "):
        with pytest.raises(CheckpointRestoreError) as exc:
            mgr.restore_latest(lrn.state, lrn.shardings)
    assert str(exc.value) == (f"no checkpoint in {tmp_path / 'ckpt'} can be restored (tried "
                              f"steps 2, 1; the newest: {exc.value.newest}); details: {log}. "
                              f"To start over, move {tmp_path / 'ckpt'} away")
    assert exc.value.tried == [2, 1] and exc.value.newest.startswith("ValueError: NOT_FOUND: ")
    assert len(exc.value.newest) <= 200
    assert log.read_text().count("Traceback (most recent call last)") == 2
    assert mgr.all_steps() == steps  # nothing moved when nothing could be restored
    mgr.close()


def test_learner_stops_after_consecutive_nonfinite(learner, batches):
    lrn, _ = learner
    trajs, _ = batches[0]
    # make_batch rejects non-finite advantages; finite but huge ones overflow the loss
    bad = [(trajs, np.full(len(trajs), 1e38, np.float32))] * 3
    version = int(lrn.state.version)
    with pytest.raises(NonFiniteError, match="consecutive steps with non-finite"):
        _run(lrn, bad)
    assert int(lrn.state.version) == version


def test_deferred_metrics_returns_previous_step():
    d = DeferredMetrics()
    assert d.push(0, {"loss": np.float32(1.0)}) is None
    step, _, host = d.push(1, {"loss": np.float32(2.0)})
    assert step == 0 and host == {"loss": 1.0}
    assert d.flush()[2] == {"loss": 2.0} and d.flush() is None


def test_a_failed_restores_leftovers_go_to_the_log_not_stderr(monkeypatch):
    """After a failed restore orbax's pending reads end on its closed event loop, printed
    by Python as unraisable exceptions (hundreds of traceback lines, some at exit): they go
    to the checkpoint log, one line each; any other unraisable exception is still shown."""
    import asyncio
    import sys
    import types

    from learners import checkpoint as ck

    shown, logged = [], []
    monkeypatch.setattr(sys, "unraisablehook", shown.append)
    ck._route_leftovers(logged.append)
    ck._route_leftovers(logged.append)  # installed once

    def unraisable(exc, obj=None):
        return types.SimpleNamespace(exc_type=type(exc), exc_value=exc, exc_traceback=None,
                                     err_msg=None, object=obj)

    closed = unraisable(RuntimeError("Event loop is closed"))
    sys.unraisablehook(closed)
    coro = asyncio.sleep(0)
    sys.unraisablehook(unraisable(RuntimeError("x"), coro))
    coro.close()
    other = unraisable(ValueError("a real problem"))
    sys.unraisablehook(other)
    assert shown == [other]
    assert logged[0] == ("ignored after a failed restore: RuntimeError: Event loop is closed "
                         "(None)")
    assert len(logged) == 2 and logged[1].startswith("ignored after a failed restore: "
                                                    "RuntimeError: x (<coroutine object sleep")
