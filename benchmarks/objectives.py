"""Value+grad time of every objective relative to ``grpo``, measured side by side.

Prints one JSON object: per objective the median wall time (ms) of a jitted
``value_and_grad`` over ``--repeats`` calls (after warm-up, ``block_until_ready``) and its
ratio to ``grpo`` (default config, and ``grpo_token_mean`` for an aggregation-matched
reference of ENTR). Objectives are timed round-robin so load drift hits all equally.

    python benchmarks/objectives.py --batch 64 --length 4096 --repeats 30

``--step`` adds the figure that matters for training: the time of a whole learner step
(tiny model forward + backward + AdamW, `learners.learner.Learner`) with ``entr`` against
``grpo`` (same aggregation), same batch, timed alternately.
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
    p.add_argument("--step", action="store_true", help="also time whole learner steps")
    p.add_argument("--step-rows", type=int, default=16)
    p.add_argument("--step-length", type=int, default=256)
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
    if args.step:
        out["learner_step"] = learner_step_ratio(args.step_rows, args.step_length,
                                                 args.repeats, args.warmup)
    print(json.dumps(out, indent=1))


def learner_step_ratio(rows: int, length: int, repeats: int, warmup: int) -> dict:
    """Median whole-step time with ``entr`` vs ``grpo`` (token-mean) on the tiny model."""
    import numpy as np
    from flax import nnx

    from entr_jax.assets import tiny_dir
    from entr_jax.model import Decoder, ModelConfig
    from entr_jax.types import Trajectory
    from learners.learner import Learner, LearnerConfig
    from learners.optim import OptimizerConfig

    cfg = ModelConfig.from_hf_config(json.loads((tiny_dir() / "config.json").read_text()))
    rng = np.random.default_rng(0)
    half = length // 2
    trajs = [Trajectory(
        prompt_ids=rng.integers(4, cfg.vocab_size, half).astype(np.int32),
        response_ids=rng.integers(4, cfg.vocab_size, half).astype(np.int32),
        logp_mu=-rng.exponential(1.0, half).astype(np.float32),
        entropy_mu=rng.exponential(1.0, half).astype(np.float32),
        token_version=np.zeros(half, np.int32), loss_mask=np.ones(half, bool))
        for _ in range(rows)]
    adv = rng.normal(size=rows).astype(np.float32)
    lc = LearnerConfig(optimizer=OptimizerConfig(learning_rate=1e-6), pad_id=3)
    learners = {
        name: Learner(lambda: Decoder(cfg, rngs=nnx.Rngs(0)), lc,
                      objective=obj.make_objective(name, aggregation="token_mean"))
        for name in ("grpo", "entr")
    }
    times: dict[str, list[float]] = {n: [] for n in learners}
    for i in range(warmup + repeats):
        for name, learner in learners.items():
            t0 = time.perf_counter()
            learner.train_on(trajs, adv)
            jax.block_until_ready(learner.state.params)
            if i >= warmup:
                times[name].append((time.perf_counter() - t0) * 1e3)
    med = {n: statistics.median(v) for n, v in times.items()}
    return {"rows": rows, "length": length, "grpo_ms": round(med["grpo"], 2),
            "entr_ms": round(med["entr"], 2),
            "ratio_entr_to_grpo": round(med["entr"] / med["grpo"], 4)}


if __name__ == "__main__":
    main()
