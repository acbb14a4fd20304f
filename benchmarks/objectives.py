"""Value+grad cost of every objective relative to ``grpo``, measured side by side.

Prints one JSON object. Per objective (a jitted ``value_and_grad`` at ``[B, T]`` =
``--batch x --length``):

* ``ms``: median wall time over ``--repeats`` rounds (after ``--warmup`` calls,
  ``block_until_ready``), with ``p25``/``p75``/``min``/``max``. Rounds are interleaved:
  every round times each objective once, in turn, so load drift hits all equally;
* ``ratio_to_grpo`` / ``ratio_to_grpo_token_mean``: the median of the per-round paired
  ratios (this objective's time in round i over the reference's in round i) with its
  ``[p25, p75]``; ``grpo_token_mean`` is ``grpo`` with ENTR's aggregation (token_mean),
  the reference ENTR is held to;
* ``cpu_ms`` / ``cpu_ratio_to_*``: the same for the process CPU time of each call
  (``time.process_time``, all threads), which other processes disturb less than wall time;
* ``load_1m``: the median 1-minute load average (``os.getloadavg``) sampled every round,
  with its min and max: on a loaded machine wall times mean little without it;
* ``hlo``: flops, bytes accessed and transcendentals of the compiled program
  (``jax.jit(f).lower(...).compile().cost_analysis()``), the number of reductions JAX
  lowers (each a pass over the data), and their ratios to the two
  references: a load-independent measure of the work next to the wall time.

    python benchmarks/objectives.py --batch 64 --length 4096 --repeats 30
    python benchmarks/objectives.py --only entr,grpo_token_mean --repeats 20   # quick

``--split`` also times, in the same rounds, each objective's gradient of the loss alone
(``jax.grad`` of ``objective(...)[0]``: the metrics are unused, so the compiler drops
them), as ``results[name]["loss_grad_only"]`` with its wall and CPU times, paired ratios
and ``hlo`` cost: what the loss and its gradient cost apart from the metric contract.

``--step`` adds the figure that matters for training: the time of a whole learner step
(tiny model forward + backward + AdamW, `learners.learner.Learner`) with ``entr`` against
``grpo`` (same aggregation), same batch, timed alternately, reported the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import time

import jax
import jax.numpy as jnp

from entr_jax import objectives as obj
from entr_jax.types import Batch

REFERENCES = ("grpo", "grpo_token_mean")


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


def variants(only: list[str] | None = None) -> dict:
    """``{name: objective}``: every registry objective (default config) but the ``estr``
    alias, plus ``grpo_token_mean``; ``only`` restricts it (the references are kept)."""
    out = {n: obj.make_objective(n) for n in obj.OBJECTIVES if n != "estr"}
    out["grpo_token_mean"] = obj.make_objective("grpo", aggregation="token_mean")
    if only:
        unknown = sorted(set(only) - set(out))
        if unknown:
            raise SystemExit(f"--only: unknown objective(s) {unknown}; known: {sorted(out)}")
        out = {n: f for n, f in out.items() if n in set(only) | set(REFERENCES)}
    return out


def hlo_cost(fn, *args) -> dict[str, float]:
    """``flops``, ``bytes accessed`` and ``transcendentals`` of ``jax.jit(fn)`` compiled for
    ``args`` (XLA's cost analysis of the optimized program: deterministic for a given jax
    version, backend and shape, independent of load)."""
    lowered = jax.jit(fn).lower(*args)
    cost = lowered.compile().cost_analysis()
    if isinstance(cost, (list, tuple)):  # older jax: one dict per computation
        cost = cost[0]
    out = {k: float(cost.get(k, 0.0)) for k in ("flops", "bytes accessed", "transcendentals")}
    # passes over the data the metrics cost: the reductions JAX lowers (before XLA fuses)
    out["reductions"] = float(len(re.findall(r"stablehlo\.reduce[ (]", lowered.as_text())))
    return out


def _quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def spread(xs: list[float], digits: int = 4) -> dict[str, float]:
    """Median, quartiles and range of ``xs``."""
    return {"median": round(statistics.median(xs), digits), "p25": round(_quantile(xs, 0.25), digits),
            "p75": round(_quantile(xs, 0.75), digits), "min": round(min(xs), digits),
            "max": round(max(xs), digits)}


def paired_ratio(xs: list[float], ref: list[float]) -> dict[str, float]:
    """Median and quartiles of the per-round ratios ``xs[i] / ref[i]``."""
    r = [a / b for a, b in zip(xs, ref)]
    s = spread(r)
    return {"median": s["median"], "p25": s["p25"], "p75": s["p75"]}


def interleaved(calls: dict, repeats: int, warmup: int) -> tuple[dict, dict, list[float]]:
    """Times every ``calls[name]()`` once per round, in turn, for ``warmup + repeats``
    rounds; returns, for the last ``repeats`` rounds, the wall ms and the process CPU ms
    (``time.process_time``: every thread of this process; less sensitive to other
    processes than wall time) per name, and the 1-minute load average sampled at the
    start of each round."""
    wall: dict[str, list[float]] = {n: [] for n in calls}
    cpu: dict[str, list[float]] = {n: [] for n in calls}
    load: list[float] = []
    for i in range(warmup + repeats):
        if i >= warmup:
            load.append(os.getloadavg()[0])
        for name, call in calls.items():
            c0, t0 = time.process_time(), time.perf_counter()
            call()
            ms, cpu_ms = (time.perf_counter() - t0) * 1e3, (time.process_time() - c0) * 1e3
            if i >= warmup:
                wall[name].append(ms)
                cpu[name].append(cpu_ms)
    return wall, cpu, load


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--length", type=int, default=4096)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--only", default="", help="comma-separated objectives (references always run)")
    p.add_argument("--split", action="store_true",
                   help="also time the gradient of the loss alone (metrics dropped)")
    p.add_argument("--step", action="store_true", help="also time whole learner steps")
    p.add_argument("--step-rows", type=int, default=16)
    p.add_argument("--step-length", type=int, default=256)
    p.add_argument("--step-repeats", type=int, default=10)
    args = p.parse_args()
    if args.repeats < 10 or args.step_repeats < 10:
        raise SystemExit("--repeats and --step-repeats must be >= 10 (medians of fewer mean little under load)")

    logp_pi, batch = make_batch(args.batch, args.length)
    objs = variants([s for s in args.only.split(",") if s])
    grads = {n: jax.value_and_grad(f, has_aux=True) for n, f in objs.items()}
    if args.split:  # keyed "<name>/loss_grad_only"
        grads.update({f"{n}/loss_grad_only": jax.grad(lambda lp, b, f=f: f(lp, b)[0])
                      for n, f in objs.items()})
    calls = {}
    for n, g in grads.items():  # each compiled before the timed rounds
        f = jax.jit(g)
        jax.block_until_ready(f(logp_pi, batch))
        calls[n] = lambda f=f: jax.block_until_ready(f(logp_pi, batch))
    times, cpu, load = interleaved(calls, args.repeats, args.warmup)
    cost = {n: hlo_cost(g, logp_pi, batch) for n, g in grads.items()}

    def figures(n: str, suffix: str = "") -> dict:
        """Times, paired ratios to the references and HLO cost of ``n + suffix``."""
        key = n + suffix
        r = {"ms": spread(times[key]), "cpu_ms": spread(cpu[key])}
        for ref in REFERENCES:
            r[f"ratio_to_{ref}"] = paired_ratio(times[key], times[ref + suffix])
            r[f"cpu_ratio_to_{ref}"] = paired_ratio(cpu[key], cpu[ref + suffix])
        r["hlo"] = dict(cost[key])
        for ref in REFERENCES:
            r["hlo"][f"ratio_to_{ref}"] = {k: round(v / max(cost[ref + suffix][k], 1.0), 4)
                                           for k, v in cost[key].items()}
        return r

    results = {}
    for n in objs:
        results[n] = figures(n)
        if args.split:
            results[n]["loss_grad_only"] = figures(n, "/loss_grad_only")
    out = {
        "benchmark": "objectives_value_and_grad",
        "backend": jax.default_backend(),
        "device": str(jax.devices()[0].device_kind),
        "jax": jax.__version__,
        "shape": [args.batch, args.length],
        "repeats": args.repeats,
        "load_1m": spread(load, 2),
        "results": results,
    }
    if "entr" in results:
        out["entr_over_grpo_token_mean"] = {
            "wall_paired_ratio": results["entr"]["ratio_to_grpo_token_mean"],
            "cpu_paired_ratio": results["entr"]["cpu_ratio_to_grpo_token_mean"],
            "hlo": results["entr"]["hlo"]["ratio_to_grpo_token_mean"],
            "load_1m": out["load_1m"],
        }
        if args.split:
            alone = results["entr"]["loss_grad_only"]
            out["entr_over_grpo_token_mean"].update(
                loss_grad_only_paired_ratio=alone["ratio_to_grpo_token_mean"],
                loss_grad_only_cpu_paired_ratio=alone["cpu_ratio_to_grpo_token_mean"],
                loss_grad_only_hlo=alone["hlo"]["ratio_to_grpo_token_mean"])
    if args.step:
        out["learner_step"] = learner_step_ratio(args.step_rows, args.step_length,
                                                 args.step_repeats, args.warmup)
    print(json.dumps(out, indent=1))


def learner_step_ratio(rows: int, length: int, repeats: int, warmup: int) -> dict:
    """Whole-step time with ``entr`` vs ``grpo`` (token-mean) on the tiny model, interleaved
    (`interleaved`), with the paired ratio and the load average of the rounds."""
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

    def call(learner):
        learner.train_on(trajs, adv)
        jax.block_until_ready(learner.state.params)

    times, cpu, load = interleaved({n: (lambda lr=lr: call(lr)) for n, lr in learners.items()},
                                   repeats, warmup)
    return {"rows": rows, "length": length, "repeats": repeats,
            "grpo_ms": spread(times["grpo"], 2), "entr_ms": spread(times["entr"], 2),
            "ratio_entr_to_grpo": paired_ratio(times["entr"], times["grpo"]),
            "cpu_ratio_entr_to_grpo": paired_ratio(cpu["entr"], cpu["grpo"]),
            "load_1m": spread(load, 2)}


if __name__ == "__main__":
    main()
