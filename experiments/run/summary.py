"""``summary.json``: a finished run's results in one file (evaluations before and after
RL, rewards, the staleness realised, where the time went)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from entr_jax.staleness import full_lag_steps
from experiments.run.checkpointing import Book
from experiments.run.config import RunConfig
from experiments.run.phases import PhaseClock
from experiments.run.rundir import RunDir


def time_split(clock: PhaseClock, verifier: Any, total_s: float,
               startup_s: float | None) -> dict[str, Any]:
    """``time/phases`` (wall seconds: sft_s + eval_s + rl_s + compile_s + other_s =
    total_s = ``wall_clock_s``), ``time/phases_cpu`` (process CPU seconds per phase),
    ``time/rl_split`` (RL sub-phases, compilation included), ``time/startup_s``
    (imports and parsing before the job, when run from the command line) and
    ``time/counts`` (SFT steps, episodes, verifier checks, compilations); see
    `experiments.run.phases`."""
    split = clock.split(total_s)
    v = verifier
    counts = dict(split["counts"], compilations=split["compiles"],
                  verifier_checks=v.num_checks, verifier_fast_path=v.num_fast_path,
                  verifier_math_verify=v.num_worker_checks)
    return {"time/phases": split["wall"], "time/phases_cpu": split["cpu"],
            "time/rl_split": split["sub"], "time/startup_s": startup_s,
            "time/counts": counts,
            "time/compilations_by_function": split["compiles_by_function"]}


def summary(cfg: RunConfig, run: RunDir, book: Book, eval_sets: dict[str, Any],
            objective_config: Any, timing: dict[str, Any]) -> dict[str, Any]:
    """The summary of a run from its bookkeeping (`Book`: ``evals`` per phase,
    ``elapsed_s``, ``rl_wall_s``), its ``metrics.jsonl``, the objective's config and
    `time_split`'s figures (``timing``). The primary benchmark is the first evaluation
    set."""
    primary = next(iter(eval_sets))
    k = cfg.task.eval_samples

    def bench(phase):
        return book.evals[phase]["benchmarks"][primary]

    records = run.read_jsonl("metrics.jsonl")
    rewards = [r["reward/mean"] for r in records]
    w = max(1, min(10, len(rewards)))
    realised = {k: [r[f"staleness/{k}_mean"] for r in records if f"staleness/{k}_mean" in r]
                for k in ("inter", "intra")}
    realised = {k: float(np.mean(v)) if v else None for k, v in realised.items()}
    return {
        "primary_benchmark": primary,
        "eval_metric": f"avg@{k} (sampled at temperature {cfg.sampling.temperature})",
        "eval_accuracy_init": bench("init")["avg@n"],
        "eval_accuracy_before": bench("before_rl")["avg@n"],
        "eval_accuracy_after": bench("after_rl")["avg@n"],
        "eval_ref_logp_before": bench("before_rl").get("ref_logp"),
        "eval_ref_logp_after": bench("after_rl").get("ref_logp"),
        "eval_greedy_before": bench("before_rl")["greedy"],
        "eval_greedy_after": bench("after_rl")["greedy"],
        f"eval_pass@{k}_before": bench("before_rl")[f"pass@{k}"],
        f"eval_pass@{k}_after": bench("after_rl")[f"pass@{k}"],
        "rl_steps": cfg.rl_steps,
        "sft_steps": cfg.sft.steps,
        "reward_first": float(np.mean(rewards[:w])) if rewards else None,
        "final_reward": float(np.mean(rewards[-w:])) if rewards else None,
        "wall_clock_s": book.elapsed_s,
        "rl_wall_clock_s": book.rl_wall_s,
        "objective": cfg.objective.name,
        "objective_config": dataclasses.asdict(objective_config),
        "staleness_mode": cfg.staleness.mode,
        # what the lag realised over all steps (measured; the delay line fills first)
        # and how many steps the schedule gives the configured lag in full (planned;
        # None in async mode; preflight.lag_horizon)
        "staleness_realised_inter_mean": realised["inter"],
        "staleness_realised_intra_mean": realised["intra"],
        "staleness_full_lag_steps": full_lag_steps(cfg.staleness, cfg.rl_steps),
        **timing,
        "evals": {phase: book.evals[phase]["benchmarks"] for phase in book.evals},
    }
