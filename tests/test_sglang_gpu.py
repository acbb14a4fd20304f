"""Real-engine check of `SGLangFleet`: one SGLang server on a GPU, a tiny random Qwen2.

Marked ``sglang`` (deselected by the default ``addopts``); run on a GPU host with SGLang
installed (``pip install -e ".[sglang]"``)::

    python -m pytest -q -m sglang tests/test_sglang_gpu.py -rs

It is skipped, with the reason, when ``import sglang`` fails or no CUDA GPU is visible.

What it checks, on the embedded tiny ``Qwen2ForCausalLM`` (``entr_jax.assets.tiny_dir()``)
with random weights:

1. version 0 (launch weights): every returned ``logp_mu`` equals the JAX model's
   ``log softmax(logits)[token]`` of the same prompt + response
   (`entr_jax.logprobs.token_logprobs_entropy`, run on CPU in float32), every
   ``entropy_mu`` equals the top-k estimate computed from the JAX log-probs, and
   ``token_version == 0``;
2. after ``update_weights_from_path(dir_v1, 1)``: the same against the version-1 model, and
   ``token_version == 1``.
Each phase also asserts that the engine's log-probs are far (more than
``SEPARATION x tolerance``) from the *other* version's model, so a server that ignored the
update, or a comparison that always passes, fails.

Environment overrides (all optional):
  ``ENTR_SGLANG_TEST_DTYPE``: ``float32`` (default) or ``bfloat16``, passed as ``--dtype``;
    selects the tolerance (see `LOGP_ATOL`).
  ``ENTR_SGLANG_TEST_ARGS``: replaces the default extra server flags (`DEFAULT_SERVER_ARGS`),
    split with ``shlex`` (e.g. to try ``--attention-backend triton``).
  ``ENTR_SGLANG_TEST_GPU``: GPU index for ``CUDA_VISIBLE_DEVICES`` (default 0).
  ``ENTR_SGLANG_TEST_STARTUP_S``: how long to wait for ``/health_generate`` (default 600 s).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time

import httpx
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from entr_jax.assets import tiny_dir
from entr_jax.interfaces import SamplingParams
from entr_jax.logprobs import token_logprobs_entropy
from entr_jax.model import Decoder, ModelConfig, save_pretrained
from samplers.sglang_config import SGLangFleetConfig
from samplers.sglang_entropy import topk_entropy_bounds
from samplers.sglang_fleet import SGLangFleet
from samplers.sglang_launch import SGLangLaunchConfig, server_commands, server_urls

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
TOP_K = 20
NUM_SAMPLES = 2
PROMPT_LENGTHS = (3, 8, 21)
PARAMS = SamplingParams(temperature=1.0, max_new_tokens=16, seed=11)
MIN_TOKENS = 12  # fewer compared tokens than this means the engine barely generated

# Absolute tolerance on log-probs (nats), by the server's --dtype.
# float32: the reference is an f32 CPU forward; the engine runs the same f32 math on the
#   GPU with another summation order. Pure f32 would agree to ~1e-5; 0.05 also covers
#   TF32 matmuls (10-bit mantissa, relative rounding 2^-11 ~ 5e-4 per input) should the
#   engine or torch enable them: logits of size ~5 summed over D = 256 terms move by
#   ~1e-2, and the log-sum-exp adds about as much.
# bfloat16: weights and activations are rounded to 8-bit mantissas (relative 2^-9 ~ 2e-3)
#   in every one of the 4 layers; with O(1) logits that moves log-probs by ~0.1 nats.
LOGP_ATOL = {"float32": 0.05, "bfloat16": 0.3}
# The top-k entropy estimate (docs/sglang.md section 4) is a smooth function of the
# top-k probabilities; with |d log p_i| <= atol its change is bounded by about
# sum_i p_i |log p_i + 1| * atol + (tail-mass term), a few times atol for entropies of
# 2 to 5 nats (as this model has), hence 4x.
ENTROPY_ATOL_FACTOR = 4.0
# The other version's model must differ from the engine by this many tolerances
# somewhere (two independent random models differ by several nats per token here).
SEPARATION = 5.0

# float32 compute on the GPU; torch_native attention and the pytorch sampler because they
# accept float32 (FlashInfer/FA3 attention kernels are half-precision only); no CUDA
# graphs (faster start, eager path). Not yet run on a real engine: if some fused kernel
# of the installed SGLang refuses float32 (the server log then names the dtype), run with
# ENTR_SGLANG_TEST_DTYPE=bfloat16, which uses the bf16 tolerance.
DEFAULT_SERVER_ARGS = (
    "--attention-backend", "torch_native",
    "--sampling-backend", "pytorch",
    "--disable-cuda-graph",
    "--random-seed", "0",
)


# ----------------------------------------------------------------------- requirements
def _cuda_gpu_visible() -> bool:
    """True if ``nvidia-smi -L`` lists a GPU or ``torch.cuda.is_available()``."""
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
            if out.returncode == 0 and "GPU" in out.stdout:
                return True
        except (OSError, subprocess.TimeoutExpired):
            pass
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _missing_requirements() -> list[str]:
    reasons = []
    try:
        import sglang  # noqa: F401
    except Exception as e:  # any import failure means no usable engine
        reasons.append(f"`import sglang` failed ({type(e).__name__}: {e}); "
                       "install with pip install -e '.[sglang]'")
    if not _cuda_gpu_visible():
        reasons.append("no CUDA GPU visible (nvidia-smi -L lists none and "
                       "torch.cuda.is_available() is False)")
    return reasons


@pytest.fixture(scope="module")
def gpu_and_sglang():
    """Skips (naming what is missing) unless sglang imports and a CUDA GPU is visible.

    Checked in a fixture, not at import, so the default (deselected) run never imports
    sglang or torch.
    """
    reasons = _missing_requirements()
    if reasons:
        pytest.skip("needs SGLang and a CUDA GPU: " + "; ".join(reasons))


def _server_dtype() -> str:
    dtype = os.environ.get("ENTR_SGLANG_TEST_DTYPE", "float32")
    if dtype not in LOGP_ATOL:
        raise ValueError(f"ENTR_SGLANG_TEST_DTYPE must be one of {sorted(LOGP_ATOL)}, got {dtype!r}")
    return dtype


# ----------------------------------------------------------------------- models
def _tiny_config() -> ModelConfig:
    with open(tiny_dir() / "config.json") as f:
        return ModelConfig.from_hf_config(json.load(f))


def _random_decoder(config: ModelConfig, seed: int) -> Decoder:
    """The tiny decoder with O(1)-scale random weights drawn from ``seed``.

    The default init (std 0.02) gives near-uniform next-token distributions (log-probs all
    ~ -log V), which would make a wrong model look right. Here: embeddings N(0, 0.15^2)
    (tied unembedding: logit std ~ 0.15 * sqrt(256) = 2.4), kernels N(0, 1/fan_in), biases
    N(0, 0.1^2), norm gains 1 + N(0, 0.1^2): entropies of ~2-5 nats per position.
    """
    model = Decoder(config, rngs=nnx.Rngs(seed))
    rng = np.random.default_rng(seed)
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        shape = var.get_value().shape
        kind = path[-1]
        if kind == "embedding":
            value = 0.15 * rng.standard_normal(shape)
        elif kind == "kernel":
            value = rng.standard_normal(shape) / np.sqrt(shape[0])
        elif kind == "bias":
            value = 0.1 * rng.standard_normal(shape)
        elif kind == "scale":
            value = 1.0 + 0.1 * rng.standard_normal(shape)
        else:
            raise KeyError(f"unexpected parameter {path!r}")
        var.set_value(jnp.asarray(value, jnp.float32))
    return model


def _export(model: Decoder, path) -> str:
    """HF directory SGLang can serve: weights + config (save_pretrained) + tokenizer files."""
    save_pretrained(model, str(path))
    for name in TOKENIZER_FILES:
        shutil.copy(tiny_dir() / name, os.path.join(str(path), name))
    return str(path)


@pytest.fixture(scope="module")
def policies(gpu_and_sglang, tmp_path_factory):
    """``{version: (model, hf_dir)}`` for versions 0 and 1 (independent random weights)."""
    config = _tiny_config()
    out = {}
    for version, seed in ((0, 100), (1, 101)):
        model = _random_decoder(config, seed)
        out[version] = (model, _export(model, tmp_path_factory.mktemp(f"policy_v{version}")))
    return out


# ----------------------------------------------------------------------- server
def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _log_tail(path, n_chars: int = 4000) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()[-n_chars:]
    except OSError as e:
        return f"(no server log: {e})"


def _stop(proc: subprocess.Popen, log_file) -> None:
    """SIGTERM, then SIGKILL after 30 s, to the server's own process group."""
    try:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        else:
            # The launcher exited; its scheduler/detokenizer children may still be alive.
            os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    finally:
        log_file.close()


@pytest.fixture(scope="module")
def server_url(policies, tmp_path_factory, request):
    """Base URL of one SGLang server serving version 0, killed at module teardown."""
    dtype = _server_dtype()
    env_args = os.environ.get("ENTR_SGLANG_TEST_ARGS")
    extra = tuple(shlex.split(env_args)) if env_args is not None else DEFAULT_SERVER_ARGS
    cfg = SGLangLaunchConfig(
        model_path=policies[0][1],
        gpu_ids=(int(os.environ.get("ENTR_SGLANG_TEST_GPU", "0")),),
        host="127.0.0.1",
        base_port=_free_port(),
        mem_fraction_static=0.2,
        extra_args=("--dtype", dtype) + extra,
        python=sys.executable,
    )
    (cmd,) = server_commands(cfg)
    (url,) = server_urls(cfg)
    log_path = tmp_path_factory.mktemp("sglang_log") / "server.log"
    log_file = open(log_path, "w")
    print(f"starting: {cmd.shell()}  (log: {log_path})")
    proc = subprocess.Popen(list(cmd.argv), env={**os.environ, **cmd.env}, stdout=log_file,
                            stderr=subprocess.STDOUT, start_new_session=True)
    request.addfinalizer(lambda: _stop(proc, log_file))  # registered before any wait

    deadline = time.monotonic() + float(os.environ.get("ENTR_SGLANG_TEST_STARTUP_S", "600"))
    last = "no answer yet"
    while True:
        if proc.poll() is not None:
            pytest.fail(f"SGLang server exited with code {proc.returncode} before becoming "
                        f"healthy; log tail:\n{_log_tail(log_path)}")
        try:
            resp = httpx.get(url + "/health_generate", timeout=30.0)
            if resp.status_code == 200:
                break
            last = f"HTTP {resp.status_code}: {resp.text[:200]}"
        except httpx.HTTPError as e:
            last = repr(e)
        if time.monotonic() > deadline:
            pytest.fail(f"SGLang server not healthy within the startup timeout (last: {last}); "
                        f"log tail:\n{_log_tail(log_path)}")
        time.sleep(2.0)
    return url


@pytest.fixture(scope="module")
def fleet(server_url, tmp_path_factory):
    config = SGLangFleetConfig(
        server_urls=(server_url,),
        vocab_size=_tiny_config().vocab_size,
        entropy_top_k=TOP_K,
        request_timeout_s=120.0,
        control_timeout_s=300.0,
        max_attempts=2,
        backoff_initial_s=0.5,
        backoff_max_s=2.0,
        max_concurrency=8,
        initial_version=0,
        export_dir=str(tmp_path_factory.mktemp("fleet_exports")),
    )
    with SGLangFleet(config) as f:
        yield f


# ----------------------------------------------------------------------- reference
def _jax_reference(model: Decoder, prompt: np.ndarray, response: np.ndarray):
    """``(logp [R], entropy_estimate [R])`` of ``response`` given ``prompt`` under ``model``.

    ``logp`` from `token_logprobs_entropy` (f32, CPU); the entropy estimate is
    `topk_entropy_bounds` applied to the model's own top-``TOP_K`` log-probs, i.e. what
    the fleet should compute from an exact engine.
    """
    tokens = jnp.asarray(np.concatenate([prompt, response])[None, :], jnp.int32)
    p, r = len(prompt), len(response)
    logp_T, _ = token_logprobs_entropy(model, tokens)
    logp = np.asarray(logp_T[0, p - 1:p - 1 + r], np.float64)
    logits = np.asarray(model(tokens)[0, p - 1:p - 1 + r], np.float64)  # [R, V]
    logsm = logits - logits.max(axis=-1, keepdims=True)
    logsm = logsm - np.log(np.exp(logsm).sum(axis=-1, keepdims=True))
    top = -np.sort(-logsm, axis=-1)[:, :TOP_K]
    estimate, _, _ = topk_entropy_bounds(top, logits.shape[-1])
    return logp, estimate


def _prompts() -> list[list[int]]:
    rng = np.random.default_rng(7)
    # ids >= 4 skip the tokenizer's special tokens (0..3: endoftext, im_start, im_end, pad)
    return [rng.integers(4, _tiny_config().vocab_size, n).tolist() for n in PROMPT_LENGTHS]


def _generate_and_compare(fleet, prompts, model, other_model, version: int, atol: float):
    """Generate, then assert versions, log-probs and entropies against ``model``."""
    results = fleet.generate(prompts, PARAMS, num_samples=NUM_SAMPLES)
    assert len(results) == len(prompts)
    engine, ref, other, h_engine, h_ref = [], [], [], [], []
    for prompt, row in zip(prompts, results):
        assert len(row) == NUM_SAMPLES
        for g in row:
            np.testing.assert_array_equal(g.prompt_ids, prompt)
            r = len(g.response_ids)
            assert 1 <= r <= PARAMS.max_new_tokens
            assert g.finish_reason in ("stop", "length")
            np.testing.assert_array_equal(g.token_version, np.full(r, version, np.int32))
            assert np.all(np.isfinite(g.logp_mu)), g.logp_mu
            logp, h_est = _jax_reference(model, g.prompt_ids, g.response_ids)
            logp_other, _ = _jax_reference(other_model, g.prompt_ids, g.response_ids)
            engine.append(g.logp_mu.astype(np.float64))
            ref.append(logp)
            other.append(logp_other)
            h_engine.append(g.entropy_mu.astype(np.float64))
            h_ref.append(h_est)
    engine, ref, other = map(np.concatenate, (engine, ref, other))
    h_engine, h_ref = np.concatenate(h_engine), np.concatenate(h_ref)
    assert engine.size >= MIN_TOKENS, f"only {engine.size} tokens generated"
    err = np.abs(engine - ref)
    print(json.dumps({"version": version, "tokens": int(engine.size),
                      "logp_max_abs_err": float(err.max()),
                      "logp_mean_abs_err": float(err.mean()),
                      "entropy_max_abs_err": float(np.abs(h_engine - h_ref).max()),
                      "other_version_max_abs_diff": float(np.abs(engine - other).max())}))
    np.testing.assert_allclose(engine, ref, rtol=0, atol=atol,
                               err_msg=f"SGLang logp_mu vs JAX model v{version}")
    np.testing.assert_allclose(h_engine, h_ref, rtol=0, atol=ENTROPY_ATOL_FACTOR * atol,
                               err_msg=f"SGLang entropy_mu vs top-{TOP_K} estimate of v{version}")
    assert np.abs(engine - other).max() > SEPARATION * atol, (
        f"engine log-probs are within {SEPARATION}x tolerance of the other version's model: "
        "the comparison cannot tell the versions apart")


@pytest.mark.sglang
def test_fleet_logprobs_match_jax_across_weight_update(fleet, policies):
    atol = LOGP_ATOL[_server_dtype()]
    (model0, _), (model1, dir1) = policies[0], policies[1]
    prompts = _prompts()

    _generate_and_compare(fleet, prompts, model0, model1, version=0, atol=atol)

    fleet.update_weights_from_path(dir1, 1)
    assert fleet.version == 1
    _generate_and_compare(fleet, prompts, model1, model0, version=1, atol=atol)

    m = fleet.metrics()
    for key in ("tokens_missing_logprob", "tokens_malformed_logprob", "tokens_nonfinite_logprob",
                "tokens_missing_entropy", "tokens_dropped", "weight_update_failures",
                "servers_marked_unhealthy"):
        assert m[f"sglang/{key}"] == 0.0, (key, m)
    assert m["sglang/weight_updates"] == 1.0
