"""Helpers for tests that run the main job on the very small model of the
``small_model_dir`` fixture (tests/conftest.py)."""

import dataclasses
import json
import warnings

import numpy as np

from entr_jax.staleness import StalenessConfig
from experiments.run.configs import QUICKSTART
from experiments.run.job import Job
from experiments.run.loop import Hook


def small_argv(model_dir, run_dir, *extra):
    """``entr-run`` arguments of a small quickstart run on ``model_dir`` (tiny arithmetic
    task of 2 prompts, 2 evaluation examples of 1 sample, inter lag 1, SFT batches of 4,
    checkpoints every 2 steps, 2 kept), then ``extra`` (fields these do not set)."""
    return ["quickstart", "--run_dir", str(run_dir), "--model.path", str(model_dir),
            "--sft.batch_size", "4", "--checkpoint.every", "2", "--checkpoint.keep", "2",
            "--token_samples_every", "0", "--task.prompts_per_step", "2",
            "--task.eval_examples", "2", "--task.eval_samples", "1",
            "--task.arithmetic_max_chars", "5", "--staleness.inter_lag", "1",
            "--staleness.intra_switches", "0", "--staleness.ring_size", "2", *extra]


def small_config(model_dir, run_dir, **changes):
    """The quickstart shrunk to seconds: 4 RL steps of 2 prompts x 3 samples, no SFT,
    inter lag 1, token samples every 2 steps, checkpoints every 2; ``changes`` replace
    top-level fields."""
    q = QUICKSTART
    cfg = dataclasses.replace(
        q, run_dir=str(run_dir), rl_steps=4, token_samples_every=2,
        model=dataclasses.replace(q.model, path=str(model_dir)),
        task=dataclasses.replace(q.task, prompts_per_step=2, samples_per_prompt=3,
                                 max_new_tokens=6, max_total_tokens=6, eval_examples=2,
                                 eval_samples=1, arithmetic_max_chars=5),
        sft=dataclasses.replace(q.sft, steps=0),
        staleness=StalenessConfig(mode="simulated", inter_lag=1, intra_switches=0,
                                  ring_size=2),
        checkpoint=dataclasses.replace(q.checkpoint, every=2, keep=2),
    )
    return dataclasses.replace(cfg, **changes)


# The runs here are a few steps long by design, shorter than their lag's delay line: the
# job's warning about it (`experiments.run.preflight.lag_horizon`) is expected, not news.
SHORT_LAG_WARNING = r"only \d+ of rl_steps=\d+ steps get the configured lag"


def run(cfg, resume=False, **options):
    """Run (or resume) ``cfg`` without progress bars; returns ``(job, summary)``.
    ``options``: `Job`'s ``hooks`` and ``advantages``. The short-lag warning is silenced
    (`SHORT_LAG_WARNING`); every other warning reaches the test."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=SHORT_LAG_WARNING, category=UserWarning)
        job = Job(cfg, resume=resume, show_progress=False, **options)
        summary = job.run_job()
    return job, summary


def metrics(run_dir):
    """The rows of ``run_dir/metrics.jsonl``."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def crash_at(step, error=KeyboardInterrupt, action=None):
    """A hook that raises ``error`` at RL step ``step`` before the update, the first thing
    of that step after its batch is handed over (nothing of the step is saved); with
    ``action(step)`` called instead of raising at that step, when given."""
    def crash(info):
        if info.step == step:
            if action is not None:
                return action(step)
            raise error(f"simulated crash at step {step}")

    return Hook(crash, phase="before_update")


def with_job_options(monkeypatch, **options):
    """Give every `Job` made from now on, also by the command line, ``options`` (its
    ``hooks`` and ``advantages``)."""
    init = Job.__init__

    def patched(self, cfg, **kw):
        init(self, cfg, **{**options, **kw})

    monkeypatch.setattr(Job, "__init__", patched)


def synthetic(parts):
    """`Job`'s ``advantages`` option giving `synthetic_advantages`."""
    return synthetic_advantages


def synthetic_advantages(batch):
    """A stand-in advantage function (`Job`'s ``advantages=synthetic``): +1 when an episode's first
    response token id is even, else -1, a signal the untrained small policy can follow (the
    task's reward is 0 for all its samples, so GRPO's advantages would be 0 and nothing
    would move)."""
    return np.array([1.0 if len(t.response_ids) and int(t.response_ids[0]) % 2 == 0 else -1.0
                     for t in batch.trajectories], np.float32)
