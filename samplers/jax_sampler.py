"""`JaxSampler`: the embedded JAX sampler (batched prefill + KV-cache decode, in-flight
weight swaps), implementing `entr_jax.interfaces.Sampler`.

Design (see also `samplers.jax_batches`, `samplers.jax_decode` and `samplers.jax_sampling`):

* **Device batches** (`samplers.jax_batches`): requests sorted by prompt length and cut
  into bucketed static shapes, a KV cache that grows with the response, replicas.
* **Determinism.** Response token ``t`` of sample ``j`` of prompt ``i`` is drawn with the key
  ``fold_in(fold_in(fold_in(key(seed mod 2**32), i), j), t)`` (``i`` = index in the
  ``prompts`` argument); it gives the token's one uniform, which is inverted through the
  distribution's CDF (`samplers.jax_sampling.draw`). The draw therefore does not depend
  on the batch composition, the sort, or bucket padding; the logits may differ in the
  last bits across bucket shapes (different reduction shapes), which only matters when
  the uniform falls within rounding of a CDF boundary.
* **Behavior statistics.** ``logp_mu``/``entropy_mu`` are the log-prob of the token and the
  entropy of the tempered, filtered, renormalised distribution sampled from, in f32 (see
  `samplers.jax_sampling`; the filter is `entr_jax.sampling_filter`, which the learner
  applies too when given the same ``top_k``/``top_p``/``min_p``). The logits are computed in the compute ``dtype``: sampling in
  bf16 against an f32 learner is a real train/inference mismatch, recorded in ``logp_mu``.
  ``config.logit_noise_std > 0`` adds a synthetic, seeded one (`samplers.jax_mismatch`);
  ``config.weight_quant`` serves quantised linear weights (`samplers.jax_quant`).
  Parameters are stored cast to the compute dtype (the model casts them there anyway).
* **Weight versions.** Every token records the version of the weights whose forward pass
  produced its distribution (``token_version``). ``weight_schedule=[(s, params, version),
  ...]`` switches weights at decode step ``s`` of every device batch (tokens ``t < s`` old,
  ``t >= s`` new; the simulated staleness mode), without changing the installed weights.
  `update_weights` from another thread while `generate` runs takes effect at the next chunk
  boundary (async mode). After a swap the KV cache is recomputed under the new weights
  when ``recompute_kv_on_swap`` (default), so each token is exactly its version's
  conditional (only the slots written so far, rounded up to a multiple of 32: a swap at
  response token s costs a prefill of P + s tokens, not of all M); otherwise the stale
  cache is kept, as inference engines do in-flight, and ``logp_mu`` is that of the mixed
  computation that actually sampled the token.
* **Multi-turn.** A prompt is any token sequence (earlier turns + environment tokens), so
  continuing a conversation is `generate` on the extended context (no prefix-cache reuse).
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from typing import Any, Literal, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from entr_jax.interfaces import SamplingParams
from entr_jax.model.decoder import Decoder, relayout
from entr_jax.types import Generation
from samplers import jax_decode
from samplers.jax_batches import BatchRun, Programs, Replica, device_batches, pow2_at_least
from samplers.jax_quant import QTYPES, WeightQuant, quantize_weights

__all__ = ["JaxSampler", "JaxSamplerConfig"]


@dataclasses.dataclass(frozen=True)
class JaxSamplerConfig:
    """Static settings of a `JaxSampler`.

    Attributes:
      max_batch_size: most rows per device batch (>= 1); batch buckets are the powers of two
        below it, and it itself.
      min_prompt_bucket: smallest prompt bucket (tokens, >= 1).
      max_prompt_len: longest accepted prompt (tokens); longer prompts raise ValueError.
      steps_per_call: decode steps per jitted chunk (>= 1): the granularity of weight swaps,
        `pause` and host synchronisation.
      dtype: compute dtype of the model and the KV cache, ``"float32"`` or ``"bfloat16"``.
      recompute_kv_on_swap: rebuild the KV cache under the new weights after a swap.
      logit_noise_std: standard deviation (logit units, >= 0) of a **synthetic**, seeded
        train/inference mismatch: Gaussian noise added to the sampler's logits, drawn per
        token from its sampling key (`samplers.jax_mismatch`); ``logp_mu``/``entropy_mu``
        describe the perturbed distribution that sampled. 0 (default) = off.
      weight_quant: ``"none"`` (default), ``"int8"``, ``"fp8"`` (e4m3) or ``"int4"``:
        serve the linear layers' weights quantised (per output channel) and dequantised,
        as a weight-quantised engine computes (`samplers.jax_quant`): a deterministic,
        context-dependent train/inference mismatch.
      scan_layers: the decoder layout the sampler serves with (`entr_jax.model.decoder`):
        False (default) keeps one weight buffer and one KV cache per layer and unrolls the
        layers in each compiled step, so a decode step reads every buffer once; True scans
        over stacked weights and a stacked cache: a smaller program, compiled faster, but
        XLA:CPU copies each layer's weights and cache slice before its matmuls (slower
        decoding there, `docs/performance.md`). Installed weights
        in the other layout are converted when installed.
      num_devices: data-parallel replicas (>= 1): the device batches are spread over the
        first ``num_devices`` of ``jax.local_devices()``, each holding a copy of the
        weights and its own KV cache, and run concurrently (module docstring). 1 = no
        replicas: the weights stay where they were given (sharded weights: XLA partitions
        the sampler's computation over their mesh). On CPU, JAX exposes one device
        unless the process starts with
        ``XLA_FLAGS=--xla_force_host_platform_device_count=N``.
    """

    max_batch_size: int = 64
    min_prompt_bucket: int = 16
    max_prompt_len: int = 4096
    steps_per_call: int = 8
    dtype: Literal["float32", "bfloat16"] = "float32"
    recompute_kv_on_swap: bool = True
    logit_noise_std: float = 0.0
    scan_layers: bool = False
    num_devices: int = 1
    weight_quant: WeightQuant = "none"

    def __post_init__(self):
        for name in ("max_batch_size", "min_prompt_bucket", "max_prompt_len", "steps_per_call",
                     "num_devices"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"JaxSamplerConfig.{name} must be an int >= 1, got {value!r}")
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError(f"JaxSamplerConfig.dtype must be 'float32' or 'bfloat16', got {self.dtype!r}")
        if self.weight_quant not in ("none", *QTYPES):
            raise ValueError(f"JaxSamplerConfig.weight_quant must be one of "
                             f"{['none', *QTYPES]}, got {self.weight_quant!r}")
        if not (isinstance(self.logit_noise_std, (int, float)) and self.logit_noise_std >= 0):
            raise ValueError("JaxSamplerConfig.logit_noise_std must be a number >= 0, got "
                             f"{self.logit_noise_std!r}")


class JaxSampler:
    """Embedded sampler over an `entr_jax.model.Decoder` (see the module docstring).

    Args:
      model: a `Decoder` whose config and parameters are used (its own dtype is ignored:
        the sampler computes in ``config.dtype``).
      version: policy version of ``model``'s weights.
      config: `JaxSamplerConfig`.

    Attributes:
      stats: cumulative counters: ``tokens_generated`` (returned response tokens),
        ``decode_steps`` (executed batched decode steps, prefill excluded), ``prefills``,
        ``weight_swaps``, ``prefill_time_s`` and ``decode_time_s`` (wall seconds). The
        counts are summed over the device batches, those the replicas run concurrently
        included (``decode_steps / prefills``: steps per batch); the times are wall time.
      last_stats: the same counters for the latest `generate` call.
    """

    def __init__(self, model: Decoder, *, version: int = 0,
                 config: JaxSamplerConfig = JaxSamplerConfig()):
        if not isinstance(model, Decoder):
            raise TypeError(f"model must be an entr_jax.model.Decoder, got {type(model).__name__}")
        self.config = config
        self.model_config = model.config
        self._dtype = jnp.dtype(config.dtype)
        abstract = nnx.eval_shape(
            lambda: Decoder(model.config, rngs=nnx.Rngs(0), dtype=self._dtype,
                            param_dtype=self._dtype, scan_layers=config.scan_layers)
        )
        self._graphdef, self._abstract_params = nnx.split(abstract)
        self._convert = jax.jit(functools.partial(
            jax_decode.serving_weights, num_layers=model.config.num_layers, dtype=self._dtype,
            stacked=config.scan_layers))
        self._devices = self._resolve_devices(config.num_devices)
        self._lock = threading.Lock()
        self._installed: tuple[Any, int] = (self._cast(nnx.state(model)), int(version))
        self._install_seq = 0
        self._running = threading.Event()
        self._running.set()
        self._held = threading.Event()
        self._traces = {"prefill": 0, "decode_chunk": 0, "recompute_cache": 0, "grow_cache": 0}
        gd = self._graphdef

        def counted(name, fn, *, graph=True):
            def wrapped(*args, **kwargs):
                self._traces[name] += 1  # runs once per trace, i.e. per compilation
                return fn(gd, *args, **kwargs) if graph else fn(*args, **kwargs)
            return functools.wraps(fn)(wrapped)

        noise = float(config.logit_noise_std)  # static: closed over by both jitted steps
        prefill = jax.jit(
            counted("prefill", functools.partial(jax_decode.prefill, logit_noise_std=noise)),
            static_argnames=("max_new_bucket", "cache_len", "cache_dtype", "filtered"))
        decode_chunk = jax.jit(
            counted("decode_chunk", functools.partial(jax_decode.decode_chunk,
                                                      logit_noise_std=noise)),
            static_argnames=("filtered",), donate_argnums=(1,))
        self.programs = Programs(  # what a device batch runs (`samplers.jax_batches`)
            prefill=prefill, decode_chunk=decode_chunk,
            recompute=jax.jit(counted("recompute_cache", jax_decode.recompute_cache),
                              static_argnames=("length",), donate_argnums=(1,)),
            grow=jax.jit(counted("grow_cache", jax_decode.grow_cache, graph=False),
                         static_argnames=("length",)),
            dtype=self._dtype)
        self.stats = self._zero_stats()
        self.last_stats = self._zero_stats()

    # ----------------------------------------------------------------- weights, pause
    @staticmethod
    def _resolve_devices(n: int) -> list[Any]:
        """The devices of the ``n`` replicas: ``[None]`` for one (no placement: device arrays
        stay where they are, host arrays go to JAX's default device), else the first ``n``
        local devices.

        Raises:
          ValueError: fewer than ``n`` local devices (names the field).
        """
        if n == 1:
            return [None]
        local = jax.local_devices()
        if n > len(local):
            hint = (" (on CPU, start the process with "
                    f"XLA_FLAGS=--xla_force_host_platform_device_count={n})"
                    if local[0].platform == "cpu" else "")
            raise ValueError(f"JaxSamplerConfig.num_devices={n} but this process has "
                             f"{len(local)} local {local[0].platform} device(s){hint}")
        return list(local[:n])

    @staticmethod
    def _zero_stats() -> dict[str, float]:
        return dict(tokens_generated=0, decode_steps=0, prefills=0, weight_swaps=0,
                    prefill_time_s=0.0, decode_time_s=0.0)

    @property
    def num_traces(self) -> dict[str, int]:
        """Compilations so far per jitted function (one trace per jit cache miss)."""
        return dict(self._traces)

    @property
    def version(self) -> int:
        """Version of the installed weights."""
        return self._installed[1]

    def _cast(self, params: Any) -> Any:
        if isinstance(params, Decoder):
            params = nnx.state(params)
        if not isinstance(params, nnx.State):
            raise TypeError(f"params must be an nnx.State or a Decoder, got {type(params).__name__}")
        try:  # the structure it has in the serving layout
            layout = jax.eval_shape(lambda p: relayout(p, self.model_config.num_layers,
                                                       stacked=self.config.scan_layers), params)
            jax.tree.map(lambda a, b: None, self._abstract_params, layout)
        except (KeyError, ValueError) as e:
            raise ValueError(f"params do not match the sampler's Decoder structure: {e}") from None
        for a, b in zip(jax.tree.leaves(self._abstract_params), jax.tree.leaves(layout)):
            if a.shape != b.shape:
                raise ValueError(f"params leaf shape {b.shape} != expected {a.shape}")
        params = quantize_weights(params, self.config.weight_quant)
        if jax.tree.structure(layout) == jax.tree.structure(params) and all(
                jnp.dtype(x.dtype) == self._dtype for x in jax.tree.leaves(params)):
            return params  # already in the serving layout and dtype: no copy
        return self._convert(params)

    def update_weights(self, params: Any, version: int) -> None:
        """Installs ``params`` (an ``nnx.State`` of a `Decoder`, or the `Decoder`) as
        ``version``. Thread-safe; a running `generate` switches at its next chunk boundary.

        Raises:
          TypeError / ValueError: params of the wrong type or structure.
        """
        cast = self._cast(params)
        with self._lock:
            self._installed = (cast, int(version))
            self._install_seq += 1

    def pause(self) -> None:
        """Holds running and future generation before their next chunk of decode steps."""
        self._running.clear()

    def resume(self) -> None:
        """Undoes `pause`."""
        self._held.clear()
        self._running.set()

    def wait_until_held(self, timeout: float | None = None) -> bool:
        """After `pause`: blocks until a running `generate` is held at a boundary (True), or
        ``timeout`` seconds pass (False)."""
        return self._held.wait(timeout)

    def _hold_if_paused(self) -> None:
        if not self._running.is_set():
            self._held.set()
            self._running.wait()
            self._held.clear()

    # ----------------------------------------------------------------- generate
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 num_samples: int = 1, *,
                 weight_schedule: Sequence[tuple[int, Any, int]] | None = None,
                 ) -> list[list[Generation]]:
        """Samples ``num_samples`` continuations of every prompt.

        Args:
          prompts: token id sequences (each non-empty, ids in ``[0, vocab_size)``, at most
            ``config.max_prompt_len`` long); any context, e.g. earlier turns.
          params: `SamplingParams`.
          num_samples: G >= 1 samples per prompt.
          weight_schedule: optional ``(decode_step, params, version)`` triples, strictly
            increasing steps >= 0: from that response token index on (in every device
            batch) the given weights are used. The installed weights are not changed.
        Returns:
          ``[len(prompts)][num_samples]`` `Generation`s, in prompt order.
        Raises:
          ValueError: bad prompts, ``num_samples`` or schedule (the message names it).
        """
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
            raise ValueError(f"num_samples must be an int >= 1, got {num_samples!r}")
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
        prompt_arrays = [self._check_prompt(i, p) for i, p in enumerate(prompts)]
        schedule = self._check_schedule(weight_schedule)
        args, filtered, new_bucket = self._sampling_args(params)
        requests = [(i, j) for i in range(len(prompt_arrays)) for j in range(num_samples)]
        requests.sort(key=lambda r: len(prompt_arrays[r[0]]))
        self.last_stats = self._zero_stats()
        out: list[list[Generation | None]] = [[None] * num_samples for _ in prompt_arrays]
        replicas = [Replica(device,
                             [(s, jax.device_put(w, device), v) for s, w, v in schedule],
                             jax.device_put(args, device)) for device in self._devices]
        batches = device_batches(len(requests), self.config.max_batch_size, len(replicas))
        for first in range(0, len(batches), len(replicas)):
            wave = [[requests[r] for r in rows] for rows in batches[first:first + len(replicas)]]
            with self._lock:  # one snapshot for the whole wave
                installed, seq = self._installed, self._install_seq
            runs = [BatchRun.start([prompt_arrays[i] for i, _ in chunk], chunk, replica,
                                   installed, seq, max_batch_size=self.config.max_batch_size,
                                   min_prompt_bucket=self.config.min_prompt_bucket)
                    for replica, chunk in zip(replicas, wave)]
            for run, gens in zip(runs, self._run_wave(runs, params, filtered, new_bucket)):
                for (i, j), gen in zip(run.request_ids, gens):
                    out[i][j] = gen
        for key, value in self.last_stats.items():
            self.stats[key] += value
        return out  # type: ignore[return-value]

    def _check_prompt(self, i: int, prompt: Sequence[int]) -> np.ndarray:
        arr = np.asarray(prompt)
        if arr.ndim != 1 or arr.size == 0 or not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"prompts[{i}] must be a non-empty 1-D sequence of ints, got {prompt!r:.80}")
        if arr.size > self.config.max_prompt_len:
            raise ValueError(f"prompts[{i}] has {arr.size} tokens > max_prompt_len {self.config.max_prompt_len}")
        if arr.min() < 0 or arr.max() >= self.model_config.vocab_size:
            raise ValueError(f"prompts[{i}] has token ids outside [0, {self.model_config.vocab_size})")
        return arr.astype(np.int32)

    def _check_schedule(self, schedule) -> list[tuple[int, Any, int]]:
        if not schedule:
            return []
        out, previous = [], -1
        for n, entry in enumerate(schedule):
            if len(entry) != 3:
                raise ValueError(f"weight_schedule[{n}] must be (decode_step, params, version)")
            step, params, version = entry
            if not isinstance(step, (int, np.integer)) or step <= previous:
                raise ValueError(f"weight_schedule[{n}] step {step!r} must be an int > {previous}")
            previous = int(step)
            out.append((int(step), self._cast(params), int(version)))
        return out

    def _sampling_args(self, p: SamplingParams):
        vocab = self.model_config.vocab_size
        stop = np.zeros((vocab,), bool)
        for t in p.stop_token_ids:
            if not 0 <= t < vocab:
                raise ValueError(f"SamplingParams.stop_token_ids has id {t} outside [0, {vocab})")
            stop[t] = True
        args = jax_decode.SamplingArgs(  # host scalars: no compiled conversion per call
            temperature=np.float32(p.temperature), top_k=np.int32(p.top_k),
            top_p=np.float32(p.top_p), min_p=np.float32(p.min_p), stop_mask=stop,
            max_new_tokens=np.int32(p.max_new_tokens), seed=np.uint32(p.seed % 2**32),
        )
        filtered = p.top_k != -1 or p.top_p < 1.0 or p.min_p > 0.0
        return args, filtered, pow2_at_least(p.max_new_tokens)

    def _run_wave(self, runs: list[BatchRun], params: SamplingParams, filtered,
                  new_bucket) -> list[list[Generation]]:
        """Prefill and decode the device batches ``runs`` (one per replica) to the end,
        each replica's work dispatched before any is waited for, so they run concurrently.
        Weight swaps, the schedule and `pause` act at the same chunk boundaries as for a
        single batch."""
        cfg = self.config
        self._hold_if_paused()
        t0 = time.perf_counter()
        for run in runs:
            run.prefill(self.programs, new_bucket, filtered,
                        min(1 + cfg.steps_per_call, params.max_new_tokens))
        for run in runs:
            run.sync(params.max_new_tokens)
        self.last_stats["prefill_time_s"] += time.perf_counter() - t0
        self.last_stats["prefills"] += len(runs)
        t0 = time.perf_counter()
        while active := [run for run in runs if run.active]:
            self._hold_if_paused()
            with self._lock:
                installed, seq = self._installed, self._install_seq
            for run in active:
                run.decode_chunk(self.programs, self.last_stats, installed, seq, new_bucket,
                                 filtered, params.max_new_tokens,
                                 steps_per_call=cfg.steps_per_call,
                                 recompute_kv_on_swap=cfg.recompute_kv_on_swap)
            for run in active:
                self.last_stats["decode_steps"] += run.sync(params.max_new_tokens)
        self.last_stats["decode_time_s"] += time.perf_counter() - t0
        return [run.generations(params, self.model_config.vocab_size, self.last_stats)
                for run in runs]
