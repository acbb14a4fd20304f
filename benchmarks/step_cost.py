"""Load-independent cost of the learner step: XLA ``cost_analysis`` of the compiled HLO.

Wall time on a shared machine moves with the load; the compiled program does not. This
prints, as one JSON object, the flops and bytes accessed that XLA's cost model assigns to

* ``step``: one ENTR optimizer step (``learners.step.make_train_step``, as
  ``benchmarks/learner.py`` builds it: the ~20M qwen2-shaped model, f32);
* ``logprob_grad``: value and gradient of ``sum(token_logprobs_entropy(...)[0])`` alone;
* ``forward``: ``Decoder.__call__`` logits;

and, for each, the count of ``copy`` / ``transpose`` instructions in the optimised HLO
(layout copies), so a change to the model can be judged without a quiet machine.

    python benchmarks/step_cost.py [--batch 2 --seq-len 1024]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

import numpy as np


def _summary(compiled) -> dict:
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):  # older jax: one dict per device program
        cost = cost[0]
    text = compiled.as_text()
    ops = re.findall(r"=\s*[\w\[\]{}:,\s.\-]*?\s(copy|transpose|dot|fusion|custom-call)\(", text)
    return {
        "flops": float(cost.get("flops", 0.0)),
        "bytes_accessed": float(cost.get("bytes accessed", 0.0)),
        "transcendentals": float(cost.get("transcendentals", 0.0)),
        "hlo_copy": ops.count("copy"),
        "hlo_transpose": ops.count("transpose"),
        "hlo_dot": ops.count("dot"),
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--skip-step", action="store_true")
    args = parser.parse_args(argv)

    import jax
    import jax.numpy as jnp
    from flax import nnx

    from benchmarks.learner import SMALL
    from entr_jax.logprobs import token_logprobs_entropy
    from entr_jax.model import Decoder, ModelConfig

    cfg = ModelConfig(**SMALL)
    b, length = args.batch, args.seq_len
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (b, length)), jnp.int32)
    mask = jnp.ones((b, length), bool)
    model = Decoder(cfg, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    out = {"batch": b, "seq_len": length, "jax": jax.__version__}

    def timed(name, fn, *xs):
        t0 = time.perf_counter()
        compiled = jax.jit(fn).lower(*xs).compile()
        out[name] = dict(_summary(compiled), compile_s=round(time.perf_counter() - t0, 1))

    timed("forward", lambda p, t, m: nnx.merge(graphdef, p)(t, m), params, tokens, mask)

    def logp_sum(p, t, m):
        logp, _ = token_logprobs_entropy(nnx.merge(graphdef, p), t, m, chunk_size=256)
        return jnp.sum(logp)

    timed("logprob_grad", jax.value_and_grad(logp_sum), params, tokens, mask)

    if not args.skip_step:
        from entr_jax.objectives import make_objective
        from entr_jax.sharding import MeshConfig, make_mesh
        from learners.distributed import shard_batch
        from learners.optim import OptimizerConfig, make_optimizer
        from learners.state import create_train_state
        from learners.step import make_train_step

        from benchmarks.learner import synthetic_rl_batch

        mesh = make_mesh(MeshConfig(data=1, fsdp=jax.device_count()))
        tx = make_optimizer(OptimizerConfig(learning_rate=1e-5))
        state, shardings = create_train_state(lambda: Decoder(cfg, rngs=nnx.Rngs(0)), tx, mesh)
        step = make_train_step("rl", tx, shardings, mesh, objective=make_objective("entr"),
                               chunk_size=256)
        host = synthetic_rl_batch(tokens, cfg.vocab_size, rng)
        t0 = time.perf_counter()
        compiled = step.fn.lower(state, shard_batch(host, mesh)).compile()
        out["step"] = dict(_summary(compiled), compile_s=round(time.perf_counter() - t0, 1))
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main()
