"""The quickstart's learner steps by layer layout and remat policy; prints JSON.

The quickstart (`experiments.configs.QUICKSTART`) trains the embedded tiny model (4
layers, hidden 256, vocabulary 1024, f32) with an SFT step of 64 rows and an ENTR step of
16 prompts x 8 samples = 128 rows, 11 and 16 tokens long (prompts of 6 and 8 tokens). At
that size a step is a few hundred small matmuls, so how the layers are applied matters
more than at 0.5B
(`benchmarks/remat.py`, `benchmarks/compile.py`). For each variant in ``--variants``
(``LAYOUT:REMAT``: ``scan`` or ``loop`` times ``none``, ``dots`` or ``full``;
`entr_jax.model.Decoder`'s ``scan_layers`` and ``remat``; ``default``: the Decoder's
defaults, which is also how an older commit's step is timed) it builds both steps
(`learners.step.make_train_step`) and reports the first call of each (compile included:
wall and process CPU seconds), then runs ``--rounds`` rounds of one SFT and one RL step
per variant in turn, so that the load of a shared machine hits every variant alike.
Per-step figures are medians over rounds of wall seconds and of process CPU seconds
(user + system of every thread, `time.process_time`); ``*_ratio_to_first`` are medians
of the per-round ratios to the first variant, from this one run. The 1-minute load
average is printed beside them: on a loaded machine compare the CPU seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

VARIANTS = ("loop:none", "scan:dots", "scan:none", "loop:dots")


def _timed(fn):
    """``(result, wall_s, cpu_s)`` of ``fn()`` with its outputs ready."""
    import jax

    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    jax.block_until_ready(out)
    return out, time.perf_counter() - w0, time.process_time() - c0


def _batch(vocab_size: int, rows: int, length: int, prompt: int, rng):
    """A host batch of ``rows x length`` random tokens with the loss on the response
    positions (``>= prompt``), standard-normal advantages and a uniform behaviour policy
    (an SFT step reads only the tokens and the loss mask)."""
    import numpy as np

    from entr_jax.types import Batch

    t = length - 1
    return Batch(
        tokens=rng.integers(4, vocab_size, (1, rows, length)).astype(np.int32),
        attention_mask=np.ones((1, rows, length), bool),
        loss_mask=np.broadcast_to(np.arange(t) >= prompt, (1, rows, t)).copy(),
        advantages=rng.normal(size=(1, rows, t)).astype(np.float32),
        logp_mu=np.full((1, rows, t), -np.log(vocab_size), np.float32),
        entropy_mu=np.full((1, rows, t), np.log(vocab_size), np.float32),
        token_version=np.zeros((1, rows, t), np.int32),
        num_loss_tokens=np.float32(rows * (t - prompt)),
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS))
    parser.add_argument("--sft-shape", type=int, nargs=3, default=[64, 11, 6],
                        metavar=("ROWS", "LENGTH", "PROMPT"), help="SFT batch (default 64 11 6)")
    parser.add_argument("--rl-shape", type=int, nargs=3, default=[128, 16, 8],
                        metavar=("ROWS", "LENGTH", "PROMPT"), help="RL batch (default 128 16 8)")
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args(argv)
    for v in args.variants:
        layout, _, remat = v.partition(":")
        if v != "default" and (layout not in ("scan", "loop")
                               or remat not in ("none", "dots", "full")):
            parser.error(f"--variants: {v!r} is not LAYOUT:REMAT with LAYOUT scan|loop and "
                         "REMAT none|dots|full")

    import jax
    import numpy as np
    from flax import nnx

    from entr_jax.assets import tiny_dir
    from entr_jax.model import Decoder, ModelConfig
    from entr_jax.objectives import make_objective
    from entr_jax.sharding import MeshConfig, make_mesh
    from learners.distributed import shard_batch
    from learners.optim import OptimizerConfig, make_optimizer
    from learners.state import create_train_state
    from learners.step import make_train_step

    jax.config.update("jax_enable_compilation_cache", False)
    with open(os.path.join(tiny_dir(), "config.json")) as f:
        cfg = ModelConfig.from_hf_config(json.load(f))
    mesh = make_mesh(MeshConfig(data=1, fsdp=jax.device_count()))
    tx = make_optimizer(OptimizerConfig(learning_rate=1e-4))
    rng = np.random.default_rng(0)
    sft_host = _batch(cfg.vocab_size, *args.sft_shape, rng)
    rl_host = _batch(cfg.vocab_size, *args.rl_shape, rng)
    runs, out = {}, {}
    for v in args.variants:
        layout, _, remat = v.partition(":")
        kw = {} if v == "default" else dict(remat=remat, scan_layers=layout == "scan")
        state, shardings = create_train_state(
            lambda: Decoder(cfg, rngs=nnx.Rngs(0), **kw), tx, mesh)
        sft = make_train_step("sft", tx, shardings, mesh)
        rl = make_train_step("rl", tx, shardings, mesh, objective=make_objective("entr"))
        sft_b, rl_b = shard_batch(sft_host, mesh), shard_batch(rl_host, mesh)
        (state, *_), sw, sc = _timed(lambda: sft(state, sft_b))
        (state, *_), rw, rc = _timed(lambda: rl(state, rl_b))
        out[v] = {"sft_first_call": {"wall_s": round(sw, 3), "cpu_s": round(sc, 3)},
                  "rl_first_call": {"wall_s": round(rw, 3), "cpu_s": round(rc, 3)}}
        runs[v] = {"state": state, "steps": (("sft", sft, sft_b), ("rl", rl, rl_b)),
                   "times": {k: [] for k in ("sft_wall", "sft_cpu", "rl_wall", "rl_cpu")}}
    load = []
    for _ in range(args.rounds):
        load.append(os.getloadavg()[0])
        for run in runs.values():
            for kind, step, batch in run["steps"]:
                (run["state"], *_), wall, cpu = _timed(lambda: step(run["state"], batch))
                run["times"][f"{kind}_wall"].append(wall)
                run["times"][f"{kind}_cpu"].append(cpu)
    first = runs[args.variants[0]]["times"]
    for v, run in runs.items():
        times = run["times"]
        for key, xs in times.items():
            out[v][f"{key}_s"] = round(statistics.median(xs), 4)
            out[v][f"{key}_ratio_to_first"] = round(statistics.median(
                [x / f for x, f in zip(xs, first[key])]), 3)
    print(json.dumps({
        "device": f"{jax.devices()[0].platform} x{jax.device_count()} ({os.cpu_count()} cores)",
        "model": "embedded tiny (4 layers, hidden 256, vocab 1024, f32)",
        "sft_rows_length_prompt": args.sft_shape, "rl_rows_length_prompt": args.rl_shape,
        "rounds": args.rounds,
        "load_1m": {"min": round(min(load), 2), "median": round(statistics.median(load), 2),
                    "max": round(max(load), 2)},
        "variants": out,
    }, indent=1))


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main()
