"""Weights & Biases logging in offline mode (no network): the same metric names and values
as TensorBoard, the run recorded in ``wandb.json``, resume, and the error without wandb."""

from __future__ import annotations

import json
import math
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

from learners.logging import LoggingConfig, Loggers, MetricsLogger, make_logger
from learners.step import HISTOGRAM_EDGES
from tests.wandb_history import offline_env, read_run

pytest.importorskip("wandb", reason="needs the wandb extra (pip install -e '.[wandb]')")

HIST = next(iter(HISTOGRAM_EDGES))
STEPS = {  # step -> (version of the batch, metrics incl. the learner's version after the step)
    3: (1, {"reward/mean": 0.25, "loss/total": -1.5, "objective/mask_frac": 0.125,
            "train/version": 2.0, HIST: np.arange(len(HISTOGRAM_EDGES[HIST]) - 1, dtype=np.int32)}),
    4: (2, {"reward/mean": 0.75, "loss/total": float("nan"), "objective/mask_frac": 0.0,
            "train/version": 3.0, HIST: np.zeros(len(HISTOGRAM_EDGES[HIST]) - 1, np.int32)}),
}
CONFIG = {"objective": {"name": "entr", "entr": {"tau": 0.5}}, "seed": 7}


@pytest.fixture
def offline(monkeypatch, tmp_path):
    offline_env(monkeypatch, tmp_path)
    return LoggingConfig(wandb=True, wandb_project="entr-test", wandb_mode="offline",
                         wandb_group="g")


def _tensorboard_scalars(logdir: Path) -> dict[int, dict[str, list[float]]]:
    """``{step: {tag: [values]}}`` of the scalar summaries in tensorboardX's event files
    (TFRecord: length, CRC, ``Event`` proto, CRC)."""
    from tensorboardX.proto import event_pb2

    out: dict[int, dict[str, list[float]]] = {}
    for path in sorted(logdir.glob("events.out.tfevents.*")):
        data = path.read_bytes()
        pos = 0
        while pos < len(data):
            (n,) = struct.unpack("<Q", data[pos:pos + 8])
            event = event_pb2.Event.FromString(data[pos + 12:pos + 12 + n])
            pos += 12 + n + 4
            for v in event.summary.value:
                if v.WhichOneof("value") == "simple_value":
                    out.setdefault(event.step, {}).setdefault(v.tag, []).append(v.simple_value)
    return out


def test_wandb_gets_the_tensorboard_names_and_values(offline, tmp_path):
    run_dir = tmp_path / "run"
    logger = make_logger(run_dir / "tb", offline, run_dir=run_dir, name="offline-test",
                         enabled=True, jsonl=False)
    assert isinstance(logger, Loggers) and isinstance(logger.loggers[0], MetricsLogger)
    logger.log_hparams(CONFIG)
    for step, (version, metrics) in STEPS.items():
        logger.log(step, version, metrics)
    logger.close()

    record = json.loads((run_dir / "wandb.json").read_text())
    assert record["mode"] == "offline" and record["url"] is None
    assert (record["project"], record["group"], record["name"]) == ("entr-test", "g", "offline-test")
    assert Path(record["path"]).parent == run_dir.resolve() / "wandb"
    assert Path(record["path"], f"run-{record['id']}.wandb").is_file()

    rows, config = read_run(record["path"])
    assert config["objective"] == CONFIG["objective"] and config["seed"] == 7
    tb = _tensorboard_scalars(run_dir / "tb")
    assert sorted(rows) == sorted(tb) == [3, 4]
    for step, (version, metrics) in STEPS.items():
        row = rows[step]
        scalars = {k: v for k, v in row.items() if not k.startswith(("_", "hist/"))}
        assert set(scalars) == set(tb[step]) == {"version", "train/version", "reward/mean",
                                                 "loss/total", "objective/mask_frac"}
        # one value per name and step: the batch's version and the learner's do not collide
        assert all(len(values) == 1 for values in tb[step].values())
        assert scalars["version"] == tb[step]["version"][0] == version
        assert scalars["train/version"] == tb[step]["train/version"][0] == version + 1
        for key in ("reward/mean", "objective/mask_frac"):
            assert scalars[key] == metrics[key] == pytest.approx(tb[step][key][0])
        loss = scalars["loss/total"]
        assert (math.isnan(float(loss)) if step == 4 else loss == -1.5)
    # the histogram as bucket counts over the same edges; an empty one is skipped, as in TB
    assert rows[3][f"{HIST}.values"] == STEPS[3][1][HIST].tolist()
    np.testing.assert_allclose(rows[3][f"{HIST}.bins"], HISTOGRAM_EDGES[HIST], rtol=1e-6)
    assert not any(k.startswith("hist/") for k in rows[4])


def test_resumed_job_continues_the_same_wandb_run(offline, tmp_path):
    run_dir = tmp_path / "run"
    first = make_logger(run_dir / "tb", offline, run_dir=run_dir, name="r", enabled=True)
    first.log(1, 0, {"reward/mean": 0.5})
    first.close()
    run_id = json.loads((run_dir / "wandb.json").read_text())["id"]
    again = make_logger(run_dir / "tb", offline, run_dir=run_dir, name="r", resume=True,
                        enabled=True)
    again.log(2, 1, {"reward/mean": 0.75})
    again.close()
    assert json.loads((run_dir / "wandb.json").read_text())["id"] == run_id
    fresh = make_logger(tmp_path / "other" / "tb", offline, run_dir=tmp_path / "other",
                        name="r", resume=True, enabled=True)  # nothing recorded: a new run
    fresh.close()
    assert json.loads((tmp_path / "other" / "wandb.json").read_text())["id"] != run_id


def test_without_wandb_installed_the_error_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    with pytest.raises(RuntimeError, match=r"pip install -e '\.\[wandb\]'"):
        make_logger(tmp_path / "tb", LoggingConfig(wandb=True), run_dir=tmp_path, name="x",
                    enabled=True)
    assert not (tmp_path / "tb").exists()  # failed before writing anything
    assert isinstance(make_logger(tmp_path / "tb", LoggingConfig(), run_dir=tmp_path, name="x",
                                  enabled=True), MetricsLogger)


def test_logging_config_validation():
    with pytest.raises(ValueError, match="logging.wandb_mode"):
        LoggingConfig(wandb_mode="cloud")
    with pytest.raises(ValueError, match="logging.wandb_project"):
        LoggingConfig(wandb_project=" ")
