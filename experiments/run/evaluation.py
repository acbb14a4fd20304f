"""Evaluation of a policy during a job: avg@k / pass@k (sampled), greedy accuracy and the
reference solutions' log-likelihood on every evaluation set, written to
``eval/<phase>.json`` and to TensorBoard, and each example's outcome to
``eval/<phase>_examples.json`` (``{"phase", "version", "benchmarks": {name: {"sampled_correct":
[correct samples of example i, of k], "greedy": [0/1 of example i]}}}``, examples in the
evaluation set's order), from which two phases' per-example difference is paired
(`experiments.readme_table`).

Phases (`experiments.run.job`): ``init`` (the starting weights; shared between runs by
`experiments.run.shared_eval`), ``before_rl`` (after the SFT warm start, or the initial one
replayed) and ``after_rl``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tqdm import tqdm

from entr_jax.evaluation import benchmark_metrics
from experiments.run import multiprocess as mp
from experiments.run.config import RunConfig
from experiments.run.episodes import Episodes
from experiments.run.phases import PhaseClock
from experiments.run.rollouts import is_correct
from experiments.run.rundir import RunDir
from experiments.run.tasks import demo_trajectory


class Evaluator:
    """Evaluates weights with the job's sampler and learner (see the module docstring).

    Args:
      cfg: the run's config (``task.eval_samples``, ``sampler.kind``, the rollout batch
        size that sets the scoring batch).
      run: the run directory; logger: the job's TensorBoard logger
        (`learners.logging.MetricsLogger`).
      sampler: the job's sampler; learner: its `learners.learner.Learner` (reference
        log-probs); episodes: its `experiments.run.episodes.Episodes`.
      share: this process's share (`experiments.run.multiprocess.Share`); with several
        processes each evaluates its share of the examples.
    """

    def __init__(self, cfg: RunConfig, run: RunDir, logger: Any, sampler: Any, learner: Any,
                 episodes: Episodes, share: mp.Share, clock: PhaseClock,
                 show_progress: bool = True):
        self.cfg, self.run, self.logger = cfg, run, logger
        self.sampler, self.learner = sampler, learner
        self.episodes, self.share, self.clock = episodes, share, clock
        self.show_progress = show_progress

    def evaluate(self, phase: str, weights: Any, version: int) -> dict[str, Any]:
        """avg@k / pass@k (sampled, k = ``task.eval_samples``) and greedy accuracy on every
        evaluation set of ``weights`` (policy ``version``); written to ``eval/<phase>.json``
        and logged; returned as ``{"phase", "version", "benchmarks": {name: metrics}}``."""
        with self.clock.phase("eval"):
            return self._evaluate(phase, weights, version)

    def _evaluate(self, phase: str, weights: Any, version: int) -> dict[str, Any]:
        self.sampler.update_weights(weights, version)
        k = self.cfg.task.eval_samples
        eval_sets = self.episodes.task.eval_sets
        if self.show_progress:
            sizes = ", ".join(f"{n}: {len(e)}" for n, e in eval_sets.items())
            tqdm.write(f"evaluating ({phase}; {sizes} examples; greedy and {k} samples each)")
        out: dict[str, Any] = {"phase": phase, "version": version, "benchmarks": {}}
        examples_out: dict[str, Any] = {"phase": phase, "version": version, "benchmarks": {}}
        for name, examples in eval_sets.items():
            # greedy: top-1 (the SGLang fleet sends it as temperature 0: the arg-max, the
            # same token among exact ties whatever the seed; samplers/sglang_protocol.py)
            argmax = dict(top_k=1, top_p=1.0, min_p=0.0)
            lo, hi = self.share.split(len(examples))  # this process's examples
            greedy, sampled = [], []
            if hi > lo:
                mine, ep = examples[lo:hi], self.episodes
                greedy = ep.run(self.sampler, mine, ep.sampling(0, 1, lo, **argmax), 1)
                sampled = ep.run(self.sampler, mine, ep.sampling(0, 2, lo), k)
                self.clock.count("eval_episodes", len(greedy) + len(sampled))
            greedy, flags = mp.concat([is_correct(t) for t in greedy],
                                      [is_correct(t) for t in sampled])
            per_example = [flags[i * k:(i + 1) * k] for i in range(len(examples))]
            ks = sorted({1, k})
            out["benchmarks"][name] = benchmark_metrics(per_example, ks=ks, greedy=greedy)
            out["benchmarks"][name].update(self.reference_logp(examples, weights))
            examples_out["benchmarks"][name] = {
                "sampled_correct": [int(sum(map(bool, c))) for c in per_example],
                "greedy": [int(bool(g)) for g in greedy]}
        self.run.write_json(f"eval/{phase}.json", out)
        self.run.write_json(f"eval/{phase}_examples.json", examples_out)
        self.log(out)
        return out

    def reference_logp(self, examples: list[dict], weights: Any) -> dict[str, float]:
        """Teacher-forced log-likelihood of the examples' reference solutions under
        ``weights``: ``ref_logp`` (mean log-prob per reference token, nats; the tempered,
        filtered distribution the learner scores) and ``ref_tokens`` (their count); {} when
        the task has no reference solutions. No sampling: the same weights give the same
        value. Every process scores every example (a collective on equal shapes), in
        batches of the rollout batch's rows."""
        task, tokenizer = self.episodes.task, self.episodes.tokenizer
        if task.reference_demos is None:
            return {}
        trajs = [demo_trajectory(d, tokenizer) for d in task.reference_demos(examples)]
        rows = max(1, self.cfg.task.prompts_per_step * self.cfg.task.samples_per_prompt
                   // self.share.count)
        total, count = 0.0, 0
        for i in range(0, len(trajs), rows):
            scored = self.learner.token_logprobs(trajs[i:i + rows], weights=weights)
            mask = scored["loss_mask"].astype(bool)
            total += float(np.sum(scored["logp_pi"][mask], dtype=np.float64))
            count += int(mask.sum())
        return {"ref_logp": total / max(count, 1), "ref_tokens": count}

    def replay(self, out: dict[str, Any]) -> None:
        """``eval/<phase>.json`` and its TensorBoard scalars from an evaluation already
        computed (the initial one as the one before RL, or one `experiments.run.shared_eval`
        stored)."""
        self.run.write_json(f"eval/{out['phase']}.json", out)
        self.log(out)

    def log(self, out: dict[str, Any]) -> None:
        """TensorBoard ``eval/<phase>/<benchmark>/{avg_at_k, pass_at_k, greedy}`` at the RL
        step (the policy version) the phase evaluates (TensorBoard tags cannot hold "@")."""
        k = str(self.cfg.task.eval_samples)
        scalars = {f"eval/{out['phase']}/{bench}/{key.replace('@n', '@' + k).replace('@', '_at_')}":
                   value for bench, m in out["benchmarks"].items() for key, value in m.items()
                   if key not in ("num_examples", "num_samples", "ref_tokens")}
        self.logger.log(out["version"], None, scalars)
