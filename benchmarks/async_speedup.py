"""Async vs sync wall-clock for the same number of learner steps, and a discrete-event
model of the speedup with N sampler nodes per learner.

1. Measured (this machine, CPU, embedded JAX sampler): the same config is run twice, in
   ``sync`` mode and in ``async`` mode (``staleness.max_staleness`` bound), and the
   wall-clock of the RL phase is compared (``summary.json: rl_wall_clock_s``). Both runs
   share the CPU cores, so overlap can only win what the two sides leave idle.
2. Modelled: per-token costs measured in the sync run (``c_s`` seconds per sampled token,
   ``c_l`` seconds per trained token, from ``timing.jsonl``) drive a discrete-event
   simulation of one learner fed by N sampler nodes. Sync baseline (as in ESTR, Table 2):
   generation and training colocated on the same N + 1 nodes, each phase split over all
   of them: ``T_sync = S * B * (c_s + c_l) / (N + 1)``. Async: N samplers each generate
   whole batches (``B * c_s``), the learner trains one batch at a time (``B * c_l``), a
   sampler may start batch ``b`` only when the learner version is at least
   ``b - max_staleness``. The predicted speedup ``T_sync / T_async`` is printed beside the
   paper's 2.6x (ESTR Table 2, DAPO-Math, H800 nodes).

3. Checked (``same_machine_model``): the same simulation with one sampler, fed with the
   per-batch costs the async run measured, against the async run's measured wall time
   (`same_machine_check`).

Usage: ``python benchmarks/async_speedup.py [--steps 20] [--max-staleness 2] [--preset
stress --model-path runs/stress_sft3500/sft_model]``; prints JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import tempfile

import numpy as np

from experiments.multirun.speedup_model import model_table, simulate_async

PAPER_SPEEDUP = 2.6


def _run(cfg) -> pathlib.Path:
    from experiments.run.job import Job

    Job(cfg, show_progress=False).run_job()
    return pathlib.Path(cfg.run_dir)


def _steady(path: pathlib.Path, key: str) -> list[float]:
    return [json.loads(x)[key] for x in (path / "timing.jsonl").read_text().splitlines()]


def same_machine_check(runs: dict[str, pathlib.Path], summary: dict, max_staleness: int) -> dict:
    """The discrete-event model against the measured async wall time on this machine: one
    sampler and one learner (the async run's own thread pair), fed with per-batch costs.

    * ``from_async_costs``: each batch's generation time and each step's learning time as
      the async run measured them (contended: the two threads share the cores), plus the
      learner's per-step overhead outside learning (logging, weight copies, per-token
      scoring) measured in the sync run as ``rl_wall - sum(sample) - sum(learn)``. This is
      the check of the model's pipeline (bounded lag, in-order consumption, one batch at
      a time): its makespan should be within 15% of the measured async RL wall time.
    * ``from_sync_costs``: the same with the sync run's (uncontended) costs: the speedup
      overlap would give if sampling and learning did not slow each other down.
    """
    sync_wall = summary["sync"]["rl_wall_clock_s"]
    async_wall = summary["async"]["rl_wall_clock_s"]
    sample = {m: _steady(d, "time/sample_s") for m, d in runs.items()}
    learn = {m: _steady(d, "time/learn_s") for m, d in runs.items()}
    steps = len(learn["sync"])
    overhead = max(0.0, (sync_wall - sum(sample["sync"]) - sum(learn["sync"])) / steps)
    out = {"learner_overhead_s_per_step": round(overhead, 4)}
    for name, mode in (("from_async_costs", "async"), ("from_sync_costs", "sync")):
        predicted = simulate_async(steps, 1, sample[mode], [x + overhead for x in learn[mode]],
                                   max_staleness)
        out[name] = {"predicted_async_rl_wall_s": round(predicted, 2),
                     "predicted_speedup": round(sync_wall / predicted, 3),
                     "predicted_over_measured_async_wall": round(predicted / async_wall, 3)}
    sample_s = np.asarray(sample["sync"])
    out["sync_batch_sample_s"] = {"median": round(float(np.median(sample_s)), 3),
                                  "max": round(float(sample_s.max()), 3),
                                  "max_over_median": round(float(sample_s.max() / np.median(sample_s)), 3)}
    return out


def _base_config(args):
    """The run both modes share: the quickstart (no warm start) or the stress testbed from
    a warm start (``--model-path``); few evaluation examples, no checkpoints or per-token
    scoring, so the RL phase is what is timed."""
    from experiments.run.configs import QUICKSTART, STRESS

    if args.preset == "stress":
        if not args.model_path:
            raise SystemExit("--preset stress needs --model-path (a warm start, e.g. "
                             "runs/stress_sft3500/sft_model; without one every response "
                             "runs to the token budget)")
        base = dataclasses.replace(STRESS, model=dataclasses.replace(STRESS.model,
                                                                     path=args.model_path))
    else:
        base = dataclasses.replace(QUICKSTART, model=dataclasses.replace(
            QUICKSTART.model, path=args.model_path or QUICKSTART.model.path))
    return dataclasses.replace(
        base, rl_steps=args.steps, token_samples_every=0,
        sft=dataclasses.replace(base.sft, steps=0),
        task=dataclasses.replace(base.task, eval_examples=8, eval_samples=1),
        checkpoint=dataclasses.replace(base.checkpoint, every=0),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--max-staleness", type=int, default=2)
    parser.add_argument("--preset", choices=("quickstart", "stress"), default="quickstart",
                        help="the run timed in both modes (stress: long responses, needs "
                             "--model-path)")
    parser.add_argument("--model-path", default="", help="warm-start weights (HF layout)")
    parser.add_argument("--out", default=None, help="where the two runs go (default: a temp dir)")
    args = parser.parse_args()

    from entr_jax.staleness import StalenessConfig

    out = pathlib.Path(args.out or tempfile.mkdtemp(prefix="async_speedup_"))
    base = _base_config(args)
    runs = {}
    load = {"before": os.getloadavg()[0]}
    for mode in ("sync", "async"):
        st = StalenessConfig(mode=mode, inter_lag=0, intra_switches=0, ring_size=1,
                             max_staleness=args.max_staleness)
        cfg = dataclasses.replace(base, run_dir=str(out / mode), staleness=st)
        runs[mode] = _run(cfg)
        load[f"after_{mode}"] = os.getloadavg()[0]
    summary = {m: json.loads((d / "summary.json").read_text()) for m, d in runs.items()}
    timing = [json.loads(x) for x in (runs["sync"] / "timing.jsonl").read_text().splitlines()]
    metrics = [json.loads(x) for x in (runs["sync"] / "metrics.jsonl").read_text().splitlines()]
    steady = timing[1:] or timing  # the first step includes compilation
    sample_s = float(np.mean([t["time/sample_s"] for t in steady]))
    learn_s = float(np.mean([t["time/learn_s"] for t in steady]))
    tokens = float(np.mean([m["tokens/num_loss_tokens"] for m in metrics]))
    c_s, c_l = sample_s / tokens, learn_s / tokens
    result = {
        "benchmark": "async_speedup",
        "preset": args.preset,
        "steps": args.steps,
        "max_staleness": args.max_staleness,
        "cpu_count": os.cpu_count(),
        "load_1m": load,
        "measured": {
            "sync_rl_wall_s": summary["sync"]["rl_wall_clock_s"],
            "async_rl_wall_s": summary["async"]["rl_wall_clock_s"],
            "speedup_async_over_sync": round(summary["sync"]["rl_wall_clock_s"]
                                             / summary["async"]["rl_wall_clock_s"], 3),
            "note": "one CPU machine: sampler and learner share the same cores",
        },
        "same_machine_model": same_machine_check(runs, summary, args.max_staleness),
        "per_token_cost_s": {"sample": c_s, "learn": c_l, "tokens_per_batch": tokens},
        "model": model_table(c_s, c_l, tokens, 200, args.max_staleness),
        "paper_speedup": PAPER_SPEEDUP,
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
