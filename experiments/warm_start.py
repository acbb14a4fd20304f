"""The supervised warm start (``sft.steps > 0``): the policy trained on the task's
demonstrations before RL, its losses in ``sft.jsonl`` and TensorBoard's ``tb/sft``.

``sft.steps`` batches of ``sft.batch_size`` demonstrations, drawn by epochs of a seeded
permutation (``[seed, 3]``), each one learner update of the SFT loss
(`learners.learner.Learner.sft_on`) with ``sft.optimizer()``. With several processes each
trains on its share of every batch (`experiments.multiprocess.Share.take`).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from tqdm import tqdm

from experiments import multiprocess as mp
from experiments.config import RunConfig
from experiments.phases import PhaseClock
from experiments.rundir import RunDir
from experiments.tasks import TaskBundle, demo_trajectory
from learners.learner import Learner, LearnerConfig
from learners.logging import MetricsLogger
from learners.optim import OptimizerConfig


def warm_start(cfg: RunConfig, task: TaskBundle, tokenizer: Any, module_fn: Callable[[], Any],
               params: Any,
               learner_config: Callable[[OptimizerConfig, int, int | None], LearnerConfig],
               share: mp.Share, run: RunDir, clock: PhaseClock,
               show_progress: bool = True) -> Any:
    """Train ``params`` (the policy's weights: ``model.path``'s, or the random init of
    ``model.init_seed``; they are trained in place, so the caller must not use them
    afterwards) on ``task.demos``; returns the trained params.

    ``learner_config(optimizer, pad_id, max_length)`` gives the SFT learner's config.

    Raises:
      ValueError: the task has no demonstrations.
    """
    sft, demos = cfg.sft, task.demos
    if not demos:
        raise ValueError(f"sft.steps > 0 but task {cfg.task.name!r} has no demonstrations")
    with clock.phase("sft"):
        opt = sft.optimizer()
        trajs = [demo_trajectory(d, tokenizer) for d in demos]
        # every demonstration is known: batches are padded to at most the longest one, not
        # to the next power of two (the quickstart's: 11 tokens, not 16)
        longest = max(len(t.prompt_ids) + len(t.response_ids) for t in trajs)
        learner = Learner(module_fn, learner_config(opt, tokenizer.pad_token_id, longest),
                          params=params)
        rng = np.random.default_rng([cfg.seed, 3])
        order = np.concatenate([rng.permutation(len(trajs))
                                for _ in range(sft.steps * sft.batch_size // len(trajs) + 1)])
        records = []
        bar = tqdm(range(sft.steps), desc="SFT warm start", disable=not show_progress,
                   dynamic_ncols=True)
        for step in bar:
            idx = order[step * sft.batch_size:(step + 1) * sft.batch_size]
            m = learner.sft_on([trajs[i] for i in share.take(idx, "sft.batch_size")])
            clock.count("sft_steps")
            if m is not None:
                records.append({"step": step - 1, "loss": m["loss"]})
                bar.set_postfix(loss=f"{m['loss']:.3f}")
        m = learner.flush()
        records.append({"step": sft.steps - 1, "loss": m["loss"]})
        # its own TensorBoard run (tb/sft): a resume purges RL steps of tb/, not SFT's
        sft_tb = MetricsLogger(run / "tb" / "sft", jsonl=False, purge_step=0)
        for r in records:
            run.append_jsonl("sft.jsonl", r)
            sft_tb.log(r["step"], None, {"sft/loss": r["loss"]})
        sft_tb.close()
        params = learner.state.params
        learner.close()
        return params
