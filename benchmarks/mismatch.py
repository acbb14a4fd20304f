"""Train/inference mismatch at lag 0: how far the sampler's ``logp_mu`` is from the
learner's ``logp_pi`` with the SAME weights, per behavior-entropy bin.

For each sampler variant (float32; bfloat16 weights, activations and KV cache, as
SGLang/vLLM serve; the synthetic logit noise of `samplers.jax_mismatch` at several
strengths), the same prompts are sampled with the same seed, and the float32 learner
scores the sampled tokens (`learners.learner.Learner.token_logprobs`, the training code
path). With ``delta = logp_pi - logp_mu`` and ``H = entropy_mu`` (nats) it reports:

* per bin of `entr_jax.metrics.ENTROPY_BUCKET_EDGES` (0, 0.1, 0.5, 1, 2, inf): token count,
  ``E[delta^2]`` and mean H (`entr_jax.metrics.ratio_by_entropy_bucket`);
* ``low_entropy_outside_band``: among tokens with ``H < low_entropy`` (default 0.1), the
  fraction whose ``|delta|`` exceeds ENTR's band ``sqrt(tau (H + eps))`` (tau = 1,
  eps = 0.01: ``|delta| > ~0.1``), i.e. that `entr_jax.objectives.entr_mask` drops;
* ``entr_masked``: the same fraction over all tokens; ``max_abs_delta``;
  ``mean_k3_kl``: `entr_jax.metrics.kl_mu_pi_k3`.

Nothing trains, so any nonzero delta is mismatch. Usage (a warm-started model, e.g. the
stress preset's SFT output)::

    python benchmarks/mismatch.py --model runs/stress_sft/sft_model \\
        --variants f32 bf16 noise=0.1 noise=0.3 noise=1.0

prints one JSON object: ``{"settings": ..., "variants": {name: stats}}``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time

import jax.numpy as jnp
import numpy as np

from entr_jax import metrics as M
from entr_jax.objectives import entr_mask


def parse_variant(text: str) -> dict:
    """``f32`` | ``bf16`` | ``noise=S`` | ``bf16+noise=S`` -> JaxSamplerConfig fields."""
    out = {"dtype": "float32", "logit_noise_std": 0.0}
    for part in text.split("+"):
        if part == "f32":
            out["dtype"] = "float32"
        elif part == "bf16":
            out["dtype"] = "bfloat16"
        elif part.startswith("noise="):
            out["logit_noise_std"] = float(part.split("=", 1)[1])
        else:
            raise ValueError(f"unknown variant part {part!r} in {text!r} (f32, bf16, noise=S)")
    return out


def mismatch_stats(arrays: dict[str, np.ndarray], tau: float = 1.0, eps: float = 0.01,
                   low_entropy: float = 0.1) -> dict:
    """The statistics of the module docstring from `Learner.token_logprobs` arrays."""
    mask = arrays["loss_mask"].astype(bool)
    delta = arrays["logp_pi"].astype(np.float32) - arrays["logp_mu"].astype(np.float32)
    h = arrays["entropy_mu"].astype(np.float32)
    buckets = {k: float(v) for k, v in M.ratio_by_entropy_bucket(
        jnp.asarray(delta), jnp.asarray(h), jnp.asarray(mask)).items()}
    edges = list(M.ENTROPY_BUCKET_EDGES) + [float("inf")]
    bins = [{"H": [edges[i], edges[i + 1]],
             "count": int(buckets[f"ratio_by_entropy/b{i}/count"]),
             "delta_sq_mean": buckets[f"ratio_by_entropy/b{i}/delta_sq_mean"],
             "entropy_mean": buckets[f"ratio_by_entropy/b{i}/entropy_mean"]}
            for i in range(len(M.ENTROPY_BUCKET_EDGES))]
    keep = np.asarray(entr_mask(jnp.asarray(delta), jnp.asarray(h), tau, eps))
    low = mask & (h < low_entropy)
    n_low = int(low.sum())
    return {
        "tokens": int(mask.sum()),
        "bins": bins,
        "low_entropy_tokens": n_low,
        "low_entropy_fraction": n_low / max(int(mask.sum()), 1),
        "low_entropy_outside_band": float((~keep & low).sum() / max(n_low, 1)),
        "entr_masked": float((~keep & mask).sum() / max(int(mask.sum()), 1)),
        "max_abs_delta": float(np.abs(np.where(mask, delta, 0.0)).max()),
        "mean_delta_sq": float(np.square(delta[mask]).mean()),
        "mean_k3_kl": float(M.kl_mu_pi_k3(jnp.asarray(delta), jnp.asarray(mask))),
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="Hugging Face directory of the policy")
    p.add_argument("--preset", default="stress", help="task, lengths and sampling from this preset")
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--variants", nargs="+", default=["f32", "bf16", "noise=0.1", "noise=0.3",
                                                      "noise=1.0"])
    p.add_argument("--tau", type=float, default=1.0)
    p.add_argument("--eps", type=float, default=0.01)
    p.add_argument("--low-entropy", type=float, default=0.1)
    args = p.parse_args(argv)

    from experiments.run.config import ModelSpec
    from experiments.run.configs import preset
    from experiments.run.job import Job
    from samplers.jax_sampler import JaxSampler, JaxSamplerConfig

    base = preset(args.preset)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = dataclasses.replace(
            base, run_dir=tmp, seed=args.seed, model=ModelSpec(path=args.model),
            sft=dataclasses.replace(base.sft, steps=0))
        parts = Job(cfg, show_progress=False).build_parts()
        examples = parts.task.train[:args.prompts]
        params = parts.episodes.sampling(0)
        out = {"settings": {"model": args.model, "preset": args.preset, "prompts": len(examples),
                            "samples": args.samples, "seed": args.seed, "tau": args.tau,
                            "eps": args.eps, "low_entropy": args.low_entropy,
                            "temperature": params.temperature,
                            "max_new_tokens": params.max_new_tokens},
               "variants": {}}
        for name in args.variants:
            sampler = JaxSampler(parts.learner.state.model(), version=0, config=JaxSamplerConfig(
                max_batch_size=len(examples) * args.samples, **parse_variant(name)))
            t0 = time.perf_counter()
            trajs = parts.episodes.run(sampler, examples, params, args.samples)
            arrays = parts.learner.token_logprobs(trajs)
            stats = mismatch_stats(arrays, args.tau, args.eps, args.low_entropy)
            stats["reward_mean"] = float(np.mean([t.reward for t in trajs]))
            stats["seconds"] = time.perf_counter() - t0
            out["variants"][name] = stats
        parts.learner.close()
        parts.task.verifier.close()
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
