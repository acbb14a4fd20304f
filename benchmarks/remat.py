"""The decoder's rematerialisation policies side by side (`Decoder(remat=...)`); prints JSON.

For each policy in ``--policies`` (default: none, dots, full) it builds the same ENTR train
step (`learners.step.make_train_step`, the benchmark learner's CPU shape from
`benchmarks/learner.py`, f32, batch 2 x 1024 unless told otherwise), reports its first call
(compile included) and the per-device temporary bytes of the compiled step (its memory
analysis), then times ``--rounds`` rounds of one step per policy in turn, so that the
load of a shared machine hits every policy alike. Step times are medians with quartiles;
``step_ratio_to_first`` is the spread of the per-round paired ratios to the first policy.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policies", nargs="+", default=["none", "dots", "full"])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--shape", choices=("small", "qwen05"), default="small")
    parser.add_argument("--dtype", choices=("f32", "bf16"), default="f32")
    args = parser.parse_args(argv)

    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from benchmarks.learner import QWEN05, SMALL, synthetic_rl_batch
    from benchmarks.objectives import spread
    from entr_jax.model import Decoder, ModelConfig
    from entr_jax.objectives import make_objective
    from entr_jax.sharding import MeshConfig, make_mesh
    from learners.distributed import shard_batch
    from learners.optim import OptimizerConfig, make_optimizer
    from learners.state import create_train_state
    from learners.step import make_train_step

    jax.config.update("jax_enable_compilation_cache", False)
    cfg = ModelConfig(**(SMALL if args.shape == "small" else QWEN05))
    dt = jnp.bfloat16 if args.dtype == "bf16" else jnp.float32
    mesh = make_mesh(MeshConfig(data=1, fsdp=jax.device_count()))
    tx = make_optimizer(OptimizerConfig(learning_rate=1e-5))
    rng = np.random.default_rng(0)
    host = synthetic_rl_batch(rng.integers(0, cfg.vocab_size, (args.batch, args.seq_len)),
                              cfg.vocab_size, rng)
    runs, out = {}, {}
    for policy in args.policies:
        state, shardings = create_train_state(
            lambda: Decoder(cfg, rngs=nnx.Rngs(0), dtype=dt, param_dtype=dt, remat=policy),
            tx, mesh)
        step = make_train_step("rl", tx, shardings, mesh, objective=make_objective("entr"),
                               chunk_size=256)
        batch = shard_batch(host, mesh)
        memory = step.fn.lower(state, batch).compile().memory_analysis()
        t0 = time.perf_counter()
        state, metrics, _ = step(state, batch)
        jax.block_until_ready(metrics)
        out[policy] = {"first_step_s_incl_compile": round(time.perf_counter() - t0, 3),
                       "temp_bytes_per_device": int(memory.temp_size_in_bytes)}
        runs[policy] = [step, state, batch, []]
    load = []
    for _ in range(args.rounds):
        load.append(os.getloadavg()[0])
        for policy, run in runs.items():
            step, state, batch, times = run
            t0 = time.perf_counter()
            state, metrics, _ = step(state, batch)
            jax.block_until_ready(metrics)
            times.append(time.perf_counter() - t0)
            run[1] = state
    first = args.policies[0]
    for policy, (_, _, _, times) in runs.items():
        out[policy]["step_s"] = round(statistics.median(times), 4)
        out[policy]["step_s_spread"] = {k: round(v, 4) for k, v in spread(times).items()}
        out[policy]["step_ratio_to_first"] = {k: round(v, 3) for k, v in spread(
            [t / f for t, f in zip(times, runs[first][3])]).items()}
    print(json.dumps({
        "device": f"{jax.devices()[0].platform} x{jax.device_count()} ({os.cpu_count()} cores)",
        "shape": args.shape, "dtype": args.dtype, "batch": args.batch,
        "seq_len": args.seq_len, "rounds": args.rounds,
        "load_1m": {k: round(v, 2) for k, v in spread(load).items()}, "policies": out,
    }, indent=1))


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main()
