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

Usage: ``python benchmarks/async_speedup.py [--steps 20] [--max-staleness 2]``; prints JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import tempfile

import numpy as np

from experiments.speedup_model import model_table

PAPER_SPEEDUP = 2.6


def _run(cfg) -> pathlib.Path:
    from experiments.loop import Job

    Job(cfg, show_progress=False).run_job()
    return pathlib.Path(cfg.run_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--max-staleness", type=int, default=2)
    parser.add_argument("--out", default=None, help="where the two runs go (default: a temp dir)")
    args = parser.parse_args()

    from entr_jax.staleness import StalenessConfig
    from experiments.configs import QUICKSTART

    out = pathlib.Path(args.out or tempfile.mkdtemp(prefix="async_speedup_"))
    base = dataclasses.replace(
        QUICKSTART, rl_steps=args.steps, token_samples_every=0,
        sft=dataclasses.replace(QUICKSTART.sft, steps=0),
        task=dataclasses.replace(QUICKSTART.task, eval_examples=8, eval_samples=1),
        checkpoint=dataclasses.replace(QUICKSTART.checkpoint, every=0),
    )
    runs = {}
    for mode in ("sync", "async"):
        st = StalenessConfig(mode=mode, inter_lag=0, intra_switches=0, ring_size=1,
                             max_staleness=args.max_staleness)
        cfg = dataclasses.replace(base, run_dir=str(out / mode), staleness=st)
        runs[mode] = _run(cfg)
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
        "steps": args.steps,
        "max_staleness": args.max_staleness,
        "measured": {
            "sync_rl_wall_s": summary["sync"]["rl_wall_clock_s"],
            "async_rl_wall_s": summary["async"]["rl_wall_clock_s"],
            "speedup_async_over_sync": round(summary["sync"]["rl_wall_clock_s"]
                                             / summary["async"]["rl_wall_clock_s"], 3),
            "note": "one CPU machine: sampler and learner share the same cores",
        },
        "per_token_cost_s": {"sample": c_s, "learn": c_l, "tokens_per_batch": tokens},
        "model": model_table(c_s, c_l, tokens, 200, args.max_staleness),
        "paper_speedup": PAPER_SPEEDUP,
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
