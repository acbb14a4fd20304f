"""Sampling throughput of SGLang's CPU engine (through `SGLangFleet`) against the embedded
JAX sampler, on the same model and machine, as JSON.

Usage (from the repository root; SGLang installed in its own environment, docs/sglang.md
section 8)::

    ENTR_SGLANG_PYTHON=/work/sglang-venv/bin/python python benchmarks/sglang_cpu.py \\
        --batch 32 --new-tokens 64 --repeats 5 --out docs/figures/sglang_cpu_<date>.json

The model is the tiny decoder in the Llama layout (4 layers, hidden 256, vocabulary
1024; `tests.test_sglang_engine.random_llama`), exported once; one SGLang server serves it
on 127.0.0.1 in bfloat16 (`samplers.sglang_launch`, ``--device cpu``), and the JAX sampler
runs it in float32 (its default) and bfloat16. Every engine samples ``--batch`` rows of
equal-length random prompts at temperature 1, no stop token, exactly ``--new-tokens``
tokens at most (SGLang also stops at the model's end-of-sequence token, which the fleet
does not ignore; rates count the tokens each call returned), and returns each
token's log-prob and entropy (the JAX sampler the exact entropy; the fleet the top-20
estimate, from ``top_logprobs_num=20``). ``tokens_per_s`` = tokens returned / seconds
of one whole call (prefill included). One warm-up call each, then ``--repeats`` rounds,
alternating the order.

Where SGLang's time goes: ``sglang_raw`` sends the fleet's ``/generate`` bodies with plain
``httpx`` (no validation, no entropy estimate): the fleet client's own cost is the
difference; ``sglang_no_logprobs`` the same bodies without log-probs (the cost of
returning ``top_logprobs_num=20``).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import socket
import statistics
import sys
import tempfile
import time

import httpx
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from entr_jax.interfaces import SamplingParams  # noqa: E402
from samplers.jax_sampler import JaxSampler, JaxSamplerConfig  # noqa: E402
from samplers.sglang_config import SGLangFleetConfig  # noqa: E402
from samplers.sglang_fleet import SGLangFleet  # noqa: E402
from samplers.sglang_launch import SGLangLaunchConfig, server_commands, server_urls  # noqa: E402
from samplers.sglang_procs import LocalServers  # noqa: E402
from samplers.sglang_protocol import build_generate_payload  # noqa: E402


def spread(xs: list[float], nd: int = 1) -> dict:
    q = np.percentile(xs, [25, 75])
    return {"median": round(statistics.median(xs), nd), "p25": round(float(q[0]), nd),
            "p75": round(float(q[1]), nd), "min": round(min(xs), nd), "max": round(max(xs), nd)}


def n_tokens(generations) -> int:
    """Tokens generated in a ``[prompt][sample]`` list of `Generation`s."""
    return sum(len(g.response_ids) for row in generations for g in row)


def main() -> None:
    from tests.test_sglang_engine import export, random_llama

    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    python = os.environ.get("ENTR_SGLANG_PYTHON")
    if not python:
        raise SystemExit("set ENTR_SGLANG_PYTHON to an interpreter with SGLang installed")
    model = random_llama(100)
    tmp = tempfile.mkdtemp(prefix="sglang-bench-")
    path = export(model, os.path.join(tmp, "model"))
    rng = np.random.default_rng(0)
    prompts = rng.integers(4, 1024, (args.batch, args.prompt_len)).tolist()
    params = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens, seed=0)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = SGLangLaunchConfig(model_path=path, device="cpu", base_port=port, python=python,
                             mem_fraction_static=0.05,
                             extra_args=("--max-total-tokens", "16384",
                                         "--disable-overlap-schedule"))
    (cmd,), (url,) = server_commands(cfg), server_urls(cfg)
    with LocalServers([cmd], [url], log_dir=os.path.join(tmp, "logs")) as procs:
        procs.wait_ready()
        fleet = SGLangFleet(SGLangFleetConfig(
            server_urls=(url,), vocab_size=1024, entropy_top_k=20, max_concurrency=args.batch,
            request_timeout_s=600.0, export_dir=os.path.join(tmp, "exports")))
        client = httpx.Client(timeout=600.0)
        pool = cf.ThreadPoolExecutor(args.batch)

        def raw(logprobs: bool) -> int:
            def one(i):
                body = build_generate_payload(prompts[i], params, args.new_tokens, 20, None,
                                              f"raw-{time.monotonic_ns()}-{i}")
                if not logprobs:
                    body.update(return_logprob=False, top_logprobs_num=0)
                r = client.post(url + "/generate", json=body)
                assert r.status_code == 200
                return len(r.json()["output_ids"])
            return sum(pool.map(one, range(args.batch)))

        def fleet_call() -> int:
            return n_tokens(fleet.generate(prompts, params))

        engines = {"sglang_fleet": fleet_call, "sglang_raw": lambda: raw(True),
                   "sglang_no_logprobs": lambda: raw(False)}
        for dtype in ("float32", "bfloat16"):
            sampler = JaxSampler(model, config=JaxSamplerConfig(
                max_batch_size=args.batch, min_prompt_bucket=args.prompt_len, steps_per_call=32,
                dtype=dtype))
            engines[f"jax_{dtype}"] = (
                lambda smp: lambda: n_tokens(smp.generate(prompts, params)))(sampler)
        warmup = {}
        for name, fn in engines.items():
            t0 = time.perf_counter()
            fn()
            warmup[name] = round(time.perf_counter() - t0, 2)
        seconds: dict[str, list[float]] = {n: [] for n in engines}
        rates: dict[str, list[float]] = {n: [] for n in engines}
        loads = []
        names = list(engines)
        for r in range(args.repeats):
            for name in (names if r % 2 == 0 else names[::-1]):
                t0 = time.perf_counter()
                made = engines[name]()
                seconds[name].append(time.perf_counter() - t0)
                rates[name].append(made / seconds[name][-1])
            loads.append(os.getloadavg()[0])
        fleet.close()
    out = {"batch": args.batch, "new_tokens": args.new_tokens, "prompt_len": args.prompt_len,
           "repeats": args.repeats, "load_1m": spread(loads, 2), "warmup_s": warmup,
           "sglang_version": __import__("subprocess").run(
               [python, "-c", "import sglang; print(sglang.__version__)"],
               capture_output=True, text=True).stdout.strip()}
    for name in engines:
        out[name] = {"tokens_per_s": spread(rates[name]),
                     "seconds": spread(seconds[name], 3)}
    for jax_name in ("jax_float32", "jax_bfloat16"):
        out[f"ratio_sglang_fleet_over_{jax_name}"] = spread(
            [a / b for a, b in zip(rates["sglang_fleet"], rates[jax_name])], 2)
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
