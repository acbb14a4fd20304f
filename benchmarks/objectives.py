"""Value+grad time of every objective relative to ``grpo``, measured side by side.

Prints one JSON object: per objective the median wall time (ms) of a jitted
``value_and_grad`` over ``--repeats`` calls (after warm-up, ``block_until_ready``) and its
ratio to ``grpo`` (default config, and ``grpo_token_mean`` for an aggregation-matched
reference of ENTR). Objectives are timed round-robin so load drift hits all equally.

    python benchmarks/objectives.py --batch 64 --length 4096 --repeats 30
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp

from entr_jax import objectives as obj
from entr_jax.types import Batch


def make_batch(b: int, t: int, seed: int = 0):
    ks = jax.random.split(jax.random.PRNGKey(seed), 6)
    logp_mu = -jnp.abs(jax.random.normal(ks[0], (b, t)))
    batch = Batch(
        tokens=jnp.zeros((b, t + 1), jnp.int32),
        attention_mask=jnp.ones((b, t + 1), bool),
        loss_mask=jax.random.uniform(ks[1], (b, t)) < 0.9,
        advantages=jax.random.normal(ks[2], (b, t)),
        logp_mu=logp_mu,
        entropy_mu=jnp.abs(jax.random.normal(ks[3], (b, t))),
        token_version=jnp.zeros((b, t), jnp.int32),
        logp_prox=logp_mu + 0.05 * jax.random.normal(ks[4], (b, t)),
        logp_ref=None,
    )
    return logp_mu + 0.3 * jax.random.normal(ks[5], (b, t)), batch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--length", type=int, default=4096)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    args = p.parse_args()

    logp_pi, batch = make_batch(args.batch, args.length)
    variants = {n: obj.make_objective(n) for n in obj.OBJECTIVES if n != "estr"}
    variants["grpo_token_mean"] = obj.make_objective("grpo", aggregation="token_mean")
    fns = {n: jax.jit(jax.value_and_grad(f, has_aux=True)) for n, f in variants.items()}
    for f in fns.values():
        for _ in range(args.warmup):
            jax.block_until_ready(f(logp_pi, batch))
    times: dict[str, list[float]] = {n: [] for n in fns}
    for _ in range(args.repeats):
        for n, f in fns.items():
            t0 = time.perf_counter()
            jax.block_until_ready(f(logp_pi, batch))
            times[n].append((time.perf_counter() - t0) * 1e3)
    med = {n: statistics.median(v) for n, v in times.items()}
    out = {
        "benchmark": "objectives_value_and_grad",
        "backend": jax.default_backend(),
        "device": str(jax.devices()[0].device_kind),
        "shape": [args.batch, args.length],
        "repeats": args.repeats,
        "results": {
            n: {"ms": round(m, 4), "ratio_to_grpo": round(m / med["grpo"], 3),
                "ratio_to_grpo_token_mean": round(m / med["grpo_token_mean"], 3)}
            for n, m in med.items()
        },
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
