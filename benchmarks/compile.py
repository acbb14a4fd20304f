"""Compile-time benchmark of the learner's programs; prints one JSON object.

Compiles, without running them, the two programs a learner builds before its first RL
step: the sharded random state init (`learners.state.make_state_init`) and the ENTR train
step (`learners.step.make_train_step`), each as ``jit(...).lower(...).compile()`` on
abstract inputs, so no parameter is materialised. Default: the Qwen2.5-0.5B shape (24
layers, hidden 896, 14 heads, 2 kv heads, intermediate 4864, vocabulary 151936), bf16,
batch 8 x 1024, an FSDP mesh over every device. Reports the trace + lower and the XLA
compile seconds of each program (wall, and the process CPU seconds under ``cpu_s``, which
the load of a shared machine distorts less), the size of each optimized HLO module
(instructions),
the per-device bytes the compiled train step holds for its arguments (its memory
analysis), and the 1-minute load average before and after: compile time is CPU time,
and on a shared machine the load moves it by tens of percent.

It also gives the bytes of parameters and optimizer state the FSDP mesh puts on each
device (from the sharded abstract state: nothing is materialised), and with
``--run-step`` initialises the state and runs the step once (loss, gradient norm, the
bytes the first local device holds). Run in several processes with the ``ENTR_*``
variables of `learners.distributed` (each process supplies its share of the batch rows),
it is the multi-host dry run of the same program (`tests/test_many_devices.py`).

The persistent compilation cache is turned off for the run (a hit would measure a file
read). ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` gives N CPU devices.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time



def _hlo_instructions(compiled) -> int:
    """Instructions of the optimized HLO module(s) (lines holding an ``=``)."""
    text = compiled.as_text()
    return sum(1 for line in text.splitlines() if " = " in line)


def _timed(fn, cpu: dict, key: str):
    """``fn()`` and its wall seconds; its process CPU seconds go to ``cpu[key]``."""
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    cpu[key] = round(time.process_time() - c0, 3)
    return out, time.perf_counter() - t0


def state_bytes(abstract, shardings) -> dict:
    """Bytes of the parameters and the optimizer state of an abstract train state: in all,
    and on the mesh's first device under ``shardings`` (`NamedSharding` per leaf)."""
    import jax
    import numpy as np

    out = {}
    for part in ("params", "opt_state"):
        leaves = jax.tree.leaves(getattr(abstract, part))
        sh = jax.tree.leaves(getattr(shardings, part))
        total = sum(int(np.prod(a.shape)) * a.dtype.itemsize for a in leaves)
        one = sum(int(np.prod(s.shard_shape(a.shape))) * a.dtype.itemsize
                  for a, s in zip(leaves, sh))
        out[part] = {"total": total, "per_device": one}
    return out


def local_rows(host, rows: int, index: int):
    """This process's ``rows`` rows (``index``-th share) of a microbatched host `Batch`
    (rows on axis 1), with its own loss-token count."""
    from entr_jax.types import BATCH_ROW_FIELDS

    def take(x):
        return None if x is None else x[:, index * rows:(index + 1) * rows]

    mine = host.replace(**{k: take(getattr(host, k)) for k in BATCH_ROW_FIELDS})
    return mine.replace(num_loss_tokens=float(mine.loss_mask.sum()))


def compile_learner(shape: dict, *, batch: int, length: int, dtype: str,
                    model_kwargs: dict | None = None, run_step: bool = False) -> dict:
    """Lower and compile the state init and the ENTR train step of ``shape``; returns the
    figures described in the module docstring (seconds, instruction counts, bytes), and
    with ``run_step`` those of one step on a randomly initialised state."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from benchmarks.learner import synthetic_rl_batch
    from entr_jax.model import Decoder, ModelConfig
    from entr_jax.objectives import make_objective
    from entr_jax.sharding import MeshConfig, make_mesh
    from learners.distributed import shard_batch
    from learners.optim import OptimizerConfig, make_optimizer
    from learners.state import make_state_init
    from learners.step import make_train_step

    cfg = ModelConfig(**shape)
    dt = jnp.bfloat16 if dtype == "bf16" else jnp.float32
    mesh = make_mesh(MeshConfig(data=1, fsdp=jax.device_count()))
    tx = make_optimizer(OptimizerConfig(learning_rate=1e-5))
    kw = dict(model_kwargs or {})

    def module_fn():
        return Decoder(cfg, rngs=nnx.Rngs(0), dtype=dt, param_dtype=dt, **kw)

    out: dict = {}
    cpu: dict = {}
    (init, shardings), out["init_abstract_s"] = _timed(
        lambda: make_state_init(module_fn, tx, mesh), cpu, "init_abstract_s")
    lowered, out["init_lower_s"] = _timed(init.lower, cpu, "init_lower_s")
    compiled, out["init_compile_s"] = _timed(lowered.compile, cpu, "init_compile_s")
    out["init_hlo_instructions"] = _hlo_instructions(compiled)

    abstract = jax.eval_shape(init)
    state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                         abstract, shardings)
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(abstract.params))
    step = make_train_step("rl", tx, shardings, mesh, objective=make_objective("entr"),
                           chunk_size=256)
    rng = np.random.default_rng(0)
    host = synthetic_rl_batch(rng.integers(0, cfg.vocab_size, (batch, length)),
                              cfg.vocab_size, rng)
    host = local_rows(host, batch // jax.process_count(), jax.process_index())
    device_batch = shard_batch(host, mesh)
    out["state_bytes"] = state_bytes(abstract, shardings)
    lowered, out["step_lower_s"] = _timed(lambda: step.fn.lower(state, device_batch), cpu,
                                          "step_lower_s")
    compiled, out["step_compile_s"] = _timed(lowered.compile, cpu, "step_compile_s")
    out["step_hlo_instructions"] = _hlo_instructions(compiled)
    memory = compiled.memory_analysis()
    if memory is not None:
        out["step_argument_bytes_per_device"] = int(memory.argument_size_in_bytes)
        out["step_temp_bytes_per_device"] = int(memory.temp_size_in_bytes)
    out["total_s"] = round(sum(v for k, v in out.items() if k.endswith("_s")), 3)
    for k, v in list(out.items()):
        if k.endswith("_s"):
            out[k] = round(v, 3)
    out["cpu_s"] = dict(cpu, total_s=round(sum(cpu.values()), 3))
    out["params"] = n_params
    if run_step:
        state = init()
        first = jax.local_devices()[0]
        out["state_bytes_on_first_local_device"] = sum(
            sh.data.nbytes for x in jax.tree.leaves((state.params, state.opt_state))
            for sh in x.addressable_shards if sh.device == first)
        _, metrics, _ = step(state, device_batch)
        out["step"] = {k: float(metrics[k]) for k in ("loss", "train/grad_norm",
                                                      "train/param_norm")}
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=("qwen05", "small", "tiny"), default="qwen05")
    parser.add_argument("--layers", type=int, default=None, help="override num_layers")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--dtype", choices=("bf16", "f32"), default="bf16")
    parser.add_argument("--model", default="{}",
                        help='JSON of extra Decoder keyword arguments, e.g. \'{"remat": "none"}\'')
    parser.add_argument("--vocab", type=int, default=None, help="override vocab_size")
    parser.add_argument("--run-step", action="store_true",
                        help="also initialise the state and run the step once")
    args = parser.parse_args(argv)

    from learners.distributed import initialize

    initialize()  # several processes: the ENTR_* variables; one: nothing
    import jax

    from benchmarks.learner import SHAPES

    jax.config.update("jax_enable_compilation_cache", False)
    shape = dict(SHAPES[args.shape])
    if args.layers is not None:
        shape["num_layers"] = args.layers
    if args.vocab is not None:
        shape["vocab_size"] = args.vocab
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    figures = compile_learner(shape, batch=args.batch, length=args.seq_len, dtype=args.dtype,
                              model_kwargs=json.loads(args.model), run_step=args.run_step)
    print(json.dumps({
        "device": f"{jax.devices()[0].platform} x{jax.device_count()} "
                  f"({jax.devices()[0].device_kind}, {os.cpu_count()} cores visible)",
        "processes": jax.process_count(),
        "jax": jax.__version__,
        "shape": args.shape, "num_layers": shape["num_layers"],
        "vocab_size": shape["vocab_size"], "batch": args.batch,
        "seq_len": args.seq_len, "dtype": args.dtype, "model_kwargs": json.loads(args.model),
        "wall_s": round(time.perf_counter() - t0, 3),
        "load_1m_before": round(load_before, 2), "load_1m_after": round(os.getloadavg()[0], 2),
        **figures,
    }, indent=1))


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main()
