"""The run configuration's sampling sections: which sampler generates the rollouts (the
embedded JAX sampler or an SGLang fleet, with the fleet's timeouts and retries) and the
sampling parameters the learner scores with, each validated when built with errors that
name the field. `experiments.run.config.RunConfig` holds them."""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Literal

from entr_jax.sampling_filter import check_filter
from experiments.run.specs import require, variant
from samplers.sglang_config import FleetPolicy, check_api_key_source


@dataclasses.dataclass(frozen=True)
class FleetSpec(FleetPolicy):
    """The SGLang fleet's timeouts, retries and health rules (``sampler.kind=sglang``
    only): every field is `samplers.sglang_config.FleetPolicy`'s, e.g.
    ``--sampler.fleet.request_timeout_s 120 --sampler.fleet.outage_wait_s 1800``."""

    FIELD_PREFIX: ClassVar[str] = "sampler.fleet."


@dataclasses.dataclass(frozen=True)
class SamplerSpec:
    """Which sampler generates the rollouts.

    Attributes:
      kind: ``jax`` (the embedded `samplers.jax_sampler.JaxSampler`, default) or
        ``sglang`` (a fleet of SGLang servers, `samplers.sglang_fleet.SGLangFleet`; start
        them as in ``docs/sglang.md``). With ``sglang``, new weights are exported as
        Hugging Face safetensors and loaded with ``/update_weights_from_disk``; simulated
        intra-trajectory switches are not available (use ``staleness.mode=async`` for real
        in-flight updates).
      server_urls: the SGLang servers (``sglang`` only), e.g. ``http://127.0.0.1:30000``.
        Weight pushes, pause/continue and the version check go to each of them directly.
      router_url: an ``sglang-router`` in front of ``server_urls`` (``sglang`` only; empty =
        none): generation then goes through it (``docs/sglang.md``).
      api_key: where the fleet's API key (sent as a bearer token) is read from when the
        job starts: ``env:NAME`` (an environment variable) or ``file:PATH`` (the first
        line of a file); empty = no key. Never the key itself, so config.json, checkpoints,
        TensorBoard and W&B hold only this reference (`samplers.sglang_config.read_api_key`).
      export_dir: where weight exports go (empty: ``<run_dir>/exports``).
      fleet: the fleet's timeouts, retries and health rules (``sglang`` only; `FleetSpec`).
      max_batch_size: rows per device batch of the embedded sampler.
      min_prompt_bucket: ``jax`` only: the smallest prompt bucket of the embedded sampler
        (tokens, >= 1; `samplers.jax_sampler.JaxSamplerConfig`): prompts are padded to a
        power of two at least this large. 8 fits short prompts (the quickstart's are at
        most 6 tokens) without padding them to 16: half the prefill and a smaller KV cache.
      logit_noise_std: ``jax`` only: a SYNTHETIC train/inference mismatch (the stress
        testbed's stand-in for an engine's numerics at a scale where bf16 alone shows
        little; `samplers.jax_mismatch`): Gaussian noise of this standard deviation (logit
        units) on the sampler's logits, seeded per token. The learner never sees it;
        ``logp_mu``/``entropy_mu`` describe the perturbed distribution that sampled, so the
        importance ratio carries the mismatch. 0 = off.
      scan_layers: ``jax`` only: the embedded sampler scans over stacked layers (a smaller
        program, compiled faster) instead of unrolling one buffer per layer (each decode
        step reads its weights and cache once; the default: faster decoding on CPU,
        `samplers.jax_sampler.JaxSamplerConfig.scan_layers`). Same tokens to float
        rounding.
      num_devices: ``jax`` only: data-parallel replicas of the embedded sampler
        (`samplers.jax_sampler.JaxSamplerConfig.num_devices`), each on one of this
        process's local devices with a full copy of the weights and its own KV cache; the
        rollout batch is spread over them. 1 (default) = no replicas: one program, placed
        where the published weights are, i.e. with the learner's sharding (on a
        multi-device learner mesh XLA partitions the sampler's computation over it).
        -1 = every local device (e.g. the 8 GPUs of a node); it is saved as -1 in
        ``config.json`` and resolved per process at start. The tokens, versions and finish
        reasons agree with the default's (a token can differ only where its uniform falls
        within float rounding of a CDF boundary); ``logp_mu``/``entropy_mu`` agree to float
        rounding (other batch shapes). On CPU, JAX shows one device unless the process
        starts with ``XLA_FLAGS=--xla_force_host_platform_device_count=N``, and the
        learner mesh then tiles those N devices too (``learner.mesh``).
      weight_quant: ``jax`` only: serve the linear layers' weights quantised with qwix and
        dequantised (``int8``, ``fp8`` e4m3 or ``int4``, one scale per output channel), as
        a weight-quantised inference engine does, while the learner keeps its own weights
        (`samplers.jax_quant`): a deterministic, context-dependent train/inference
        mismatch, correlated across the vocabulary. ``none`` (default) = off.
      recompute_kv_on_swap: ``jax`` only: after an in-flight weight switch, rebuild the KV
        cache under the new weights (default; each token is exactly its version's
        conditional) or, when false, keep the stale cache as in-flight engines
        (PipelineRL-style) do, so ``logp_mu`` is that of the mixed computation that
        sampled (`samplers.jax_sampler` module docstring).
    """

    # ``kind`` selects the sampler; every other field is read by one kind only
    # (``metadata["variants"]``), so an option of the other kind is refused
    VARIANT_FIELD: ClassVar[str] = "kind"

    kind: Literal["jax", "sglang"] = "jax"
    server_urls: tuple[str, ...] = variant((), "sglang")
    router_url: str = variant("", "sglang")
    api_key: str = variant("", "sglang")
    export_dir: str = variant("", "sglang")
    fleet: FleetSpec = variant(FleetSpec(), "sglang")
    max_batch_size: int = variant(256, "jax")
    min_prompt_bucket: int = variant(8, "jax")
    logit_noise_std: float = variant(0.0, "jax")
    scan_layers: bool = variant(False, "jax")
    num_devices: int = variant(1, "jax")
    weight_quant: Literal["none", "int8", "fp8", "int4"] = variant("none", "jax")
    recompute_kv_on_swap: bool = variant(True, "jax")

    def __post_init__(self):
        if self.kind not in ("jax", "sglang"):
            raise ValueError(f"sampler.kind must be 'jax' or 'sglang', got {self.kind!r}")
        require(self.kind != "sglang" or len(self.server_urls) > 0, "sampler.server_urls",
                 self.server_urls, "non-empty when sampler.kind is 'sglang'")
        require(all(isinstance(u, str) and u.startswith(("http://", "https://"))
                    for u in self.server_urls), "sampler.server_urls", self.server_urls,
                "http(s):// URLs (e.g. http://127.0.0.1:30000)")
        require(not self.router_url or (self.kind == "sglang" and self.router_url.startswith(
            ("http://", "https://"))), "sampler.router_url", self.router_url,
            "empty, or an http(s):// URL with sampler.kind 'sglang'")
        check_api_key_source(self.api_key, "sampler.api_key")
        require(self.max_batch_size >= 1, "sampler.max_batch_size", self.max_batch_size, ">= 1")
        require(self.min_prompt_bucket >= 1, "sampler.min_prompt_bucket",
                 self.min_prompt_bucket, ">= 1")
        require(self.logit_noise_std >= 0, "sampler.logit_noise_std", self.logit_noise_std,
                 ">= 0")
        require(self.kind == "jax" or self.logit_noise_std == 0, "sampler.logit_noise_std",
                 self.logit_noise_std, "0 with sampler.kind='sglang' (synthetic noise exists "
                 "only in the embedded sampler)")
        require(self.num_devices == -1 or self.num_devices >= 1, "sampler.num_devices",
                 self.num_devices, "-1 (every local device) or >= 1")
        require(self.kind == "jax" or self.num_devices == 1, "sampler.num_devices",
                 self.num_devices, "1 with sampler.kind='sglang' (replicas are the embedded "
                 "sampler's; a fleet has its servers)")
        require(self.weight_quant in ("none", "int8", "fp8", "int4"), "sampler.weight_quant",
                 self.weight_quant, "one of none, int8, fp8, int4")
        require(self.kind == "jax" or self.weight_quant == "none", "sampler.weight_quant",
                 self.weight_quant, "'none' with sampler.kind='sglang' (serve a quantised "
                 "checkpoint with SGLang's own --quantization instead)")
        require(self.kind == "jax" or self.recompute_kv_on_swap, "sampler.recompute_kv_on_swap",
                 self.recompute_kv_on_swap, "true with sampler.kind='sglang' (the fleet's "
                 "engine decides what happens to its cache on a weight update)")


MIN_TEMPERATURE = 0.01


@dataclasses.dataclass(frozen=True)
class SamplingSpec:
    """Rollout sampling parameters (RL defaults: no filtering).

    The learner scores the same tempered, filtered distribution (``LearnerConfig`` gets
    these values), so on-policy ``logp_pi == logp_mu``. Filters (``top_p < 1``,
    ``top_k != -1``, ``min_p > 0``) need ``sampler.kind='jax'``: SGLang reports log-probs
    from before its filters (``docs/sglang.md``), which could not be matched.

    Attributes:
      temperature: softmax temperature, >= `MIN_TEMPERATURE` (greedy evaluation uses
        top-1, not T = 0): below it the tempered distribution is an argmax to float32
        precision wherever the logits differ by more than 1, and the learner's gradient,
        which scales as 1/T, overflows (NaN at 1e-30).
      top_p: nucleus mass in (0, 1]; 1 = off.
      top_k: keep the k most likely tokens (>= 1); -1 = off.
      min_p: minimum probability relative to the mode, in [0, 1); 0 = off.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0

    def __post_init__(self):
        require(self.temperature > 0, "sampling.temperature", self.temperature, "> 0")
        require(self.temperature >= MIN_TEMPERATURE, "sampling.temperature", self.temperature,
                 f">= {MIN_TEMPERATURE} (below it sampling is an argmax to float32 "
                 "precision and the learner's gradient, which scales as 1/T, overflows; the "
                 "evaluation's greedy pass is top-1 whatever T is)")
        require(0 < self.top_p <= 1, "sampling.top_p", self.top_p, "in (0, 1]")
        require(self.top_k == -1 or self.top_k >= 1, "sampling.top_k", self.top_k,
                 "-1 (disabled) or >= 1")
        require(0 <= self.min_p < 1, "sampling.min_p", self.min_p, "in [0, 1)")
        check_filter(self.top_k, self.top_p, self.min_p, prefix="sampling.")  # types too
