"""The RL optimizer's cosine schedule takes its length from the run (issue 46): with
``optim.total_steps`` 0 it is ``rl_steps * learner.minibatches * learner.epochs`` updates,
as the supervised schedule's is ``sft.steps``."""

import dataclasses
import json

import pytest

from experiments.run.configs import QUICKSTART
from learners.optim import make_schedule


def _cfg(**optim):
    return dataclasses.replace(
        QUICKSTART, rl_steps=10,
        learner=dataclasses.replace(QUICKSTART.learner, minibatches=2, epochs=3),
        optim=dataclasses.replace(QUICKSTART.optim, **optim))


def test_a_cosine_schedule_ends_at_the_runs_last_update():
    cfg = _cfg(schedule="cosine", learning_rate=1e-4, warmup_steps=0, total_steps=0)
    assert cfg.optim.total_steps == 10 * 2 * 3
    lr = make_schedule(cfg.optim)
    assert float(lr(0)) == pytest.approx(1e-4)
    assert float(lr(30)) == pytest.approx(0.5e-4, rel=1e-6)  # half way: (1 + cos(pi/2)) / 2
    assert float(lr(60)) == pytest.approx(0.0, abs=1e-12)
    again = QUICKSTART.with_saved(json.loads(cfg.to_json()))  # as a resume reads config.json
    assert again.optim.total_steps == 60 and again == cfg


def test_a_given_length_and_constant_schedules_are_left_alone():
    assert _cfg(schedule="cosine", total_steps=500).optim.total_steps == 500
    assert _cfg().optim.schedule == "constant" and _cfg().optim.total_steps == 0
    assert QUICKSTART.optim.total_steps == 0  # presets' configs (and their runs) unchanged


def test_a_warmup_as_long_as_the_run_is_refused_naming_the_fields():
    with pytest.raises(ValueError, match=(
            r"optim.warmup_steps must be < the run's 60 optimizer updates \(rl_steps \* "
            r"learner.minibatches \* learner.epochs\), .* lower it or set optim.total_steps, "
            r"got 60")):
        _cfg(schedule="cosine", warmup_steps=60)
    assert _cfg(schedule="cosine", warmup_steps=59).optim.total_steps == 60
