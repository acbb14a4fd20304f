"""Chunked vs naive per-token log-prob + entropy: peak memory and time, printed as JSON.

Usage (from the repository root, CPU)::

    python benchmarks/logprobs.py                    # V = 151,936 (Qwen2), D = 256
    python benchmarks/logprobs.py --vocab 4096 --max-mem-fraction 0.2   # quick run

Both paths compute ``value_and_grad`` of ``sum(logp) + sum(entropy)`` with respect to
the hidden states ``[B, T, D]`` and the unembedding ``[D, V]`` (logits = hidden @ W):

* naive: materialise the ``[B, T, V]`` f32 logits, then `naive_logprobs_entropy`;
* chunked: `chunked_logprobs_entropy` with ``chunk_size`` positions per chunk.

The batch size ``B x T`` for the side-by-side run is the largest on a doubling grid whose
*naive* compiled footprint (XLA ``memory_analysis``: temp + argument + output bytes) fits
in ``--max-mem-fraction`` of the machine's MemAvailable: found by analysis, never by
running out of memory. Each timed run happens in its own subprocess, which also reports
its peak RSS (``ru_maxrss``). A second table gives the compiled footprint of both paths as
T grows at B = 1 (compile only, nothing is allocated): the chunked one stays flat.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import jax
import jax.numpy as jnp

from entr_jax.logprobs import chunked_logprobs_entropy, naive_logprobs_entropy


def make_loss(kind: str, chunk_size: int):
    def loss(hidden, w, targets):
        if kind == "naive":
            logp, ent = naive_logprobs_entropy(hidden @ w, targets)
        else:
            logp, ent = chunked_logprobs_entropy(hidden, targets, lambda h: h @ w, chunk_size=chunk_size)
        return jnp.sum(logp) + jnp.sum(ent)

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))


def abstract_inputs(b: int, t: int, d: int, v: int):
    return (
        jax.ShapeDtypeStruct((b, t, d), jnp.float32),
        jax.ShapeDtypeStruct((d, v), jnp.float32),
        jax.ShapeDtypeStruct((b, t), jnp.int32),
    )


def compiled_memory(kind: str, b: int, t: int, d: int, v: int, chunk_size: int) -> dict[str, int]:
    stats = make_loss(kind, chunk_size).lower(*abstract_inputs(b, t, d, v)).compile().memory_analysis()
    out = {
        "temp_bytes": int(stats.temp_size_in_bytes),
        "argument_bytes": int(stats.argument_size_in_bytes),
        "output_bytes": int(stats.output_size_in_bytes),
    }
    out["total_bytes"] = sum(out.values())
    return out


def mem_available_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("MemAvailable not found in /proc/meminfo")


def child(kind: str, b: int, t: int, d: int, v: int, chunk_size: int, repeats: int) -> dict:
    """Run in a subprocess: time value_and_grad, report peak RSS."""
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    hidden = jax.random.normal(k1, (b, t, d), jnp.float32)
    w = jax.random.normal(k2, (d, v), jnp.float32) * d**-0.5
    targets = jax.random.randint(k3, (b, t), 0, v, jnp.int32)
    jax.block_until_ready((hidden, w, targets))
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    fn = make_loss(kind, chunk_size)
    t0 = time.perf_counter()
    compiled = fn.lower(hidden, w, targets).compile()
    compile_s = time.perf_counter() - t0
    jax.block_until_ready(compiled(hidden, w, targets))  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        value, _ = jax.block_until_ready(compiled(hidden, w, targets))
        times.append(time.perf_counter() - t0)
    return {
        "value": float(value),
        "compile_s": round(compile_s, 3),
        "step_s_min": round(min(times), 4),
        "step_s_all": [round(x, 4) for x in times],
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "rss_after_inputs_bytes": rss_before,
    }


def run_child(kind: str, b: int, t: int, d: int, v: int, chunk_size: int, repeats: int) -> dict:
    cmd = [sys.executable, __file__, "--child", kind, "--batch", str(b), "--seq", str(t),
           "--dim", str(d), "--vocab", str(v), "--chunk-size", str(chunk_size),
           "--repeats", str(repeats)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": f"exit {proc.returncode}", "stderr_tail": proc.stderr[-2000:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("--vocab", type=int, default=151_936)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--chunk-size", type=int, default=128)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=0, help="0: search the largest naive-feasible T")
    p.add_argument("--max-mem-fraction", type=float, default=0.5,
                   help="fraction of MemAvailable the naive run may use (machine is shared)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--child", choices=["naive", "chunked"], default=None)
    args = p.parse_args(argv)
    d, v, c, b = args.dim, args.vocab, args.chunk_size, args.batch

    if args.child:
        print(json.dumps(child(args.child, b, args.seq, d, v, c, args.repeats)))
        return

    available = mem_available_bytes()
    budget = int(args.max_mem_fraction * available)
    search = []
    t = args.seq
    if not t:
        cand = 128
        while True:
            mem = compiled_memory("naive", b, cand, d, v, c)
            search.append({"B": b, "T": cand, "naive_total_bytes": mem["total_bytes"]})
            if mem["total_bytes"] > budget:
                break
            t, cand = cand, cand * 2
        if not t:
            raise SystemExit(f"even B={b}, T=128 exceeds the budget of {budget} bytes")

    side = {}
    for kind in ("naive", "chunked"):
        side[kind] = {"compiled": compiled_memory(kind, b, t, d, v, c),
                      "measured": run_child(kind, b, t, d, v, c, args.repeats)}
    n_vc, c_vc = side["naive"]["measured"], side["chunked"]["measured"]
    ratios = {
        "compiled_total_naive_over_chunked":
            side["naive"]["compiled"]["total_bytes"] / side["chunked"]["compiled"]["total_bytes"],
    }
    if "step_s_min" in n_vc and "step_s_min" in c_vc:
        ratios["peak_rss_naive_over_chunked"] = n_vc["peak_rss_bytes"] / c_vc["peak_rss_bytes"]
        ratios["time_chunked_over_naive"] = c_vc["step_s_min"] / n_vc["step_s_min"]
        ratios["value_abs_diff"] = abs(n_vc["value"] - c_vc["value"])

    growth = []
    for seq in (512, 2048, 8192, 32768):
        row = {"B": 1, "T": seq, "logits_f32_bytes": 4 * seq * v, "hidden_f32_bytes": 4 * seq * d}
        for kind in ("chunked", "naive"):
            mem = compiled_memory(kind, 1, seq, d, v, c)
            row[f"{kind}_temp_bytes"] = mem["temp_bytes"]
            row[f"{kind}_total_bytes"] = mem["total_bytes"]
        growth.append(row)

    print(json.dumps({
        "benchmark": "logprobs_entropy_value_and_grad",
        "backend": jax.default_backend(),
        "vocab": v, "dim": d, "chunk_size": c, "B": b, "T": t,
        "mem_available_bytes": available, "naive_budget_bytes": budget,
        "search": search,
        "naive": side["naive"], "chunked": side["chunked"], "ratios": ratios,
        "growth_B1": growth,
    }, indent=2))


if __name__ == "__main__":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    main()
