"""The fleet client against a real SGLang engine (opt-in tier, marker ``sglang``; not in
the default selection): the ``/generate`` contract, weight versions, pause/continue, stops,
greedy decoding, the top-k entropy bound, log-prob agreement per entropy bin, and a weight
reload.

The engine runs in an interpreter of its own, named by one setting::

    ENTR_SGLANG_PYTHON=/work/sglang-venv/bin/python python -m pytest -q -m sglang \\
        tests/test_sglang_engine.py -rs

Every test is skipped, with the reason, when ``ENTR_SGLANG_PYTHON`` is unset, is not an
interpreter, cannot ``import sglang``, or there is neither a CUDA GPU nor a CPU with Intel
AMX (``amx_tile`` in ``/proc/cpuinfo``; SGLang's CPU engine needs it). Without a GPU one
server is started on 127.0.0.1 with ``--device cpu --dtype bfloat16`` (and
``--attention-backend torch_native``, `samplers.sglang_launch`); with one, on GPU 0 in
bfloat16. Installing SGLang is SGLang's business (``docs/sglang.md`` section 8 says how it
was done for these tests); nothing of it is in this repository.

The model is the embedded tiny decoder in the Llama layout (no biases: SGLang's CPU path
loses the ``weight_loader`` of repacked qkv biases and crashes on
``/update_weights_from_disk``, ``docs/sglang.md`` section 8), with O(1)-scale random
weights, so next-token entropies span about 0.5 to 6 nats. Two versions: v0 and v1
(independent weights). The JAX model in float32 is the reference.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import shutil
import socket
import subprocess

import httpx
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from entr_jax.assets import tiny_dir
from entr_jax.interfaces import SamplingParams
from entr_jax.model import Decoder, ModelConfig, save_pretrained
from samplers.sglang_config import SGLangFleetConfig
from samplers.sglang_entropy import topk_entropy_bounds
from samplers.sglang_fleet import SGLangFleet
from samplers.sglang_launch import SGLangLaunchConfig, server_commands, server_urls
from samplers.sglang_procs import LocalServers
from samplers.sglang_protocol import build_generate_payload

pytestmark = pytest.mark.sglang

TOP_K = 20
PARAMS = SamplingParams(temperature=1.0, max_new_tokens=24, seed=11)
PROMPT_LENGTHS = (3, 8, 21, 5)
NUM_SAMPLES = 4
# Log-prob agreement of the bf16 engine with the f32 JAX model, judged per bin of the
# reference entropy H (nats): the mean squared difference E[delta^2] in each bin must stay
# under its limit, and the other version's model must be far off in every bin. bf16 rounds
# weights and activations to 8-bit mantissas (relative 2^-9) in each of 4 layers, so the
# error grows with the size of the logits, not with H alone. Measured on the CPU engine
# (sglang 0.5.23 + the fork's CPU kernel, 2026-12-06, docs/sglang.md section 8; two runs,
# the tokens are sampled without a fixed seed) E[delta^2] per bin [0, 2), [2, 4), [4, inf):
# v0 (embeddings 0.15) -, 0.032-0.042, 0.068-0.087; v1 (0.25, sharper) 0.099-0.123,
# 0.142-0.176, -; the Qwen2 of the relaunch test 0.021, 0.058, 0.051. The limits are about
# 2x the largest of them; the other version's model gives 30-140.
ENTROPY_BINS = (0.0, 2.0, 4.0, np.inf)
MSE_LIMIT = (0.25, 0.35, 0.2)
SEPARATION = 10.0  # the other version's E[delta^2] exceeds the limit this many times


# ----------------------------------------------------------------------- requirements
def _engine_python() -> tuple[str, str]:
    """``(interpreter, device)``, or skip naming what is missing."""
    python = os.environ.get("ENTR_SGLANG_PYTHON", "")
    if not python:
        pytest.skip("ENTR_SGLANG_PYTHON is not set: point it at an interpreter with SGLang "
                    "installed (docs/sglang.md section 8)")
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        pytest.skip(f"ENTR_SGLANG_PYTHON={python} is not an executable file")
    probe = subprocess.run([python, "-c", "import sglang; print(sglang.__version__)"],
                           capture_output=True, text=True, timeout=600)
    if probe.returncode != 0:
        pytest.skip(f"`import sglang` fails under {python} (exit status {probe.returncode}): "
                    f"{probe.stderr.strip()[-400:]}")
    if shutil.which("nvidia-smi") and "GPU" in subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True).stdout:
        return python, "cuda"
    try:
        with open("/proc/cpuinfo") as f:
            amx = "amx_tile" in f.read()
    except OSError:
        amx = False
    if not amx:
        pytest.skip("no CUDA GPU, and the CPU has no Intel AMX (amx_tile): SGLang's CPU "
                    "engine cannot run here")
    return python, "cpu"


# ----------------------------------------------------------------------- models
def _llama_config() -> ModelConfig:
    hf = json.loads((tiny_dir() / "config.json").read_text())
    hf.update(architectures=["LlamaForCausalLM"], model_type="llama", attention_bias=False)
    return ModelConfig.from_hf_config(hf)


def random_llama(seed: int, embed_scale: float = 0.15) -> Decoder:
    """The tiny Llama (`random_decoder`)."""
    return random_decoder(_llama_config(), seed, embed_scale)


def random_decoder(config: ModelConfig, seed: int, embed_scale: float = 0.15) -> Decoder:
    """A decoder with O(1)-scale random weights (the default init, std 0.02, gives
    near-uniform distributions that would make a wrong model look right): embeddings
    N(0, embed_scale^2) (tied unembedding), kernels N(0, 1/fan_in), biases N(0, 0.1^2),
    norm gains 1 + N(0, 0.1^2)."""
    model = Decoder(config, rngs=nnx.Rngs(seed))
    rng = np.random.default_rng(seed)
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        shape = var.get_value().shape
        kind = path[-1]
        if kind == "embedding":
            value = embed_scale * rng.standard_normal(shape)
        elif kind == "kernel":
            value = rng.standard_normal(shape) / np.sqrt(shape[0])
        elif kind == "scale":
            value = 1.0 + 0.1 * rng.standard_normal(shape)
        elif kind == "bias":
            value = 0.1 * rng.standard_normal(shape)
        else:
            raise KeyError(f"unexpected parameter {path!r}")
        var.set_value(jnp.asarray(value, jnp.float32))
    return model


def export(model: Decoder, path) -> str:
    """An HF directory SGLang serves: weights, config and the tokenizer files."""
    save_pretrained(model, str(path))
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(tiny_dir() / name, os.path.join(str(path), name))
    return str(path)


@pytest.fixture(scope="module")
def engine_env() -> tuple[str, str]:
    """``(interpreter, device)`` of the engine; skips first, before any model is built."""
    return _engine_python()


@pytest.fixture(scope="module")
def policies(engine_env, tmp_path_factory):
    """``{version: (model, hf_dir)}``: v0 (embeddings 0.15) and v1 (0.25, sharper)."""
    out = {}
    for version, seed, scale in ((0, 100, 0.15), (1, 101, 0.25)):
        model = random_llama(seed, scale)
        out[version] = (model, export(model, tmp_path_factory.mktemp(f"llama_v{version}")))
    return out


# ----------------------------------------------------------------------- server
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def engine(engine_env, policies, tmp_path_factory):
    """``(url, LocalServers)`` of one server started on v0, stopped at module teardown."""
    python, device = engine_env
    cfg = SGLangLaunchConfig(
        model_path=policies[0][1], device=device, dtype="bfloat16", base_port=_free_port(),
        python=python, mem_fraction_static=0.05 if device == "cpu" else 0.2,
        extra_args=("--max-total-tokens", "8192", "--disable-overlap-schedule",
                    "--random-seed", "0"))
    (cmd,), (url,) = server_commands(cfg), server_urls(cfg)
    logs = str(tmp_path_factory.mktemp("sglang_logs"))
    procs = LocalServers([cmd], [url], log_dir=logs, ready_timeout_s=900)
    procs.start()
    try:
        procs.wait_ready()
        yield url, procs
    finally:
        procs.stop()


def fleet_over(url: str, export_dir: str, **kw) -> SGLangFleet:
    base = dict(server_urls=(url,), vocab_size=_llama_config().vocab_size, entropy_top_k=TOP_K,
                request_timeout_s=300.0, control_timeout_s=300.0, max_attempts=2,
                backoff_initial_s=0.5, backoff_max_s=2.0, max_concurrency=8,
                reprobe_interval_s=2.0, outage_wait_s=60.0, export_dir=export_dir)
    base.update(kw)
    return SGLangFleet(SGLangFleetConfig(**base))


@pytest.fixture(scope="module")
def fleet(engine, tmp_path_factory):
    with fleet_over(engine[0], str(tmp_path_factory.mktemp("exports"))) as f:
        yield f


def _prompts() -> list[list[int]]:
    rng = np.random.default_rng(7)  # ids >= 4 skip the special tokens
    return [rng.integers(4, _llama_config().vocab_size, n).tolist() for n in PROMPT_LENGTHS]


# ----------------------------------------------------------------------- reference
def reference(model: Decoder, prompt, response) -> tuple[np.ndarray, np.ndarray]:
    """``(logp [R], entropy [R])`` of ``response`` after ``prompt`` under ``model`` (f32):
    the token log-probs and the exact entropy of each next-token distribution."""
    tokens = jnp.asarray(np.concatenate([prompt, response])[None, :], jnp.int32)
    p, r = len(prompt), len(response)
    logits = np.asarray(model(tokens)[0, p - 1:p - 1 + r], np.float64)
    logsm = logits - logits.max(-1, keepdims=True)
    logsm -= np.log(np.exp(logsm).sum(-1, keepdims=True))
    logp = logsm[np.arange(r), np.asarray(response)]
    return logp, -(np.exp(logsm) * logsm).sum(-1)


def per_bin_mse(delta: np.ndarray, entropy: np.ndarray) -> list[tuple[int, float]]:
    """``[(tokens, E[delta^2])]`` per `ENTROPY_BINS` bin of ``entropy``."""
    out = []
    for lo, hi in zip(ENTROPY_BINS[:-1], ENTROPY_BINS[1:]):
        sel = (entropy >= lo) & (entropy < hi)
        out.append((int(sel.sum()), float(np.mean(delta[sel] ** 2)) if sel.any() else 0.0))
    return out


def _compare(gens, model, other, version: int) -> dict:
    """Versions, finish reasons and per-entropy-bin log-prob agreement of ``gens``."""
    delta, delta_other, entropy = [], [], []
    for g in gens:
        r = len(g.response_ids)
        assert 1 <= r <= PARAMS.max_new_tokens and g.finish_reason in ("stop", "length")
        assert g.token_version.tolist() == [version] * r
        assert np.all(np.isfinite(g.logp_mu)) and np.all(g.logp_mu <= 1e-3)
        logp, h = reference(model, g.prompt_ids, g.response_ids)
        logp_other, _ = reference(other, g.prompt_ids, g.response_ids)
        delta.append(g.logp_mu - logp)
        delta_other.append(g.logp_mu - logp_other)
        entropy.append(h)
    delta, delta_other, entropy = map(np.concatenate, (delta, delta_other, entropy))
    bins, bins_other = per_bin_mse(delta, entropy), per_bin_mse(delta_other, entropy)
    figures = {"version": version, "tokens": int(delta.size),
               "mean_abs_delta": float(np.abs(delta).mean()),
               "max_abs_delta": float(np.abs(delta).max()),
               "mse_per_entropy_bin": bins, "other_version_mse_per_bin": bins_other}
    print(json.dumps(figures))
    assert delta.size >= 40, f"only {delta.size} tokens"
    for (n, mse), (_, mse_other), limit, lo in zip(bins, bins_other, MSE_LIMIT, ENTROPY_BINS):
        if n >= 5:
            assert mse <= limit, (f"E[delta^2] {mse:.4f} over {limit} in the bin H >= {lo}", figures)
            assert mse_other > SEPARATION * limit, (
                "the other version's model is as close: the comparison cannot tell", figures)
    return figures


# ----------------------------------------------------------------------- the contract
def test_ids_logprobs_and_versions_line_up_and_a_reload_is_served(fleet, policies, engine):
    """v0: every token's id, log-prob and version line up with the request and the JAX
    model of v0 (per entropy bin); after ``update_weights_from_path(v1, 1)`` the server
    reports ``weight_version`` "1" and serves v1."""
    (m0, _), (m1, dir1) = policies[0], policies[1]
    prompts = _prompts()
    gens = [g for row in fleet.generate(prompts, PARAMS, num_samples=NUM_SAMPLES) for g in row]
    assert [g.prompt_ids.tolist() for g in gens] == [p for p in prompts for _ in range(NUM_SAMPLES)]
    _compare(gens, m0, m1, version=0)
    fleet.update_weights_from_path(dir1, 1)
    info = httpx.get(engine[0] + "/get_model_info", timeout=30).json()
    assert info["weight_version"] == "1"
    gens = [g for row in fleet.generate(prompts, PARAMS, num_samples=NUM_SAMPLES) for g in row]
    _compare(gens, m1, m0, version=1)
    m = fleet.metrics()
    for key in ("tokens_missing_logprob", "tokens_malformed_logprob", "tokens_nonfinite_logprob",
                "tokens_invalid_logprob", "tokens_invalid_id", "tokens_dropped",
                "malformed_responses", "weight_update_failures", "servers_marked_unhealthy"):
        assert m[f"sglang/{key}"] == 0.0, (key, m)
    assert m["sglang/weight_updates"] == 1.0


def test_topk_entropy_estimate_is_within_its_bound_of_the_exact_entropy(engine):
    """With every log-prob of the vocabulary requested, the engine's exact entropy of each
    position lies inside the bounds the fleet computes from its top-k alone."""
    vocab = _llama_config().vocab_size
    payload = build_generate_payload(_prompts()[1], PARAMS, 12, vocab, 5, "entropy-probe")
    reply = httpx.post(engine[0] + "/generate", json=payload, timeout=300).json()
    full = np.array([[t[0] for t in row] for row in reply["meta_info"]["output_top_logprobs"]])
    assert full.shape == (len(reply["output_ids"]), vocab)
    p = np.exp(full)
    exact = -(p * full).sum(-1)
    np.testing.assert_allclose(p.sum(-1), 1.0, atol=2e-2)  # bf16 log-probs, renormalised
    estimate, lo, hi = topk_entropy_bounds(np.sort(full, -1)[:, ::-1][:, :TOP_K], vocab)
    slack = np.abs(np.log(p.sum(-1))) + 1e-3  # the bf16 grid's own mass error
    assert np.all(lo - slack <= exact) and np.all(exact <= hi + slack), (lo, exact, hi)
    assert np.all(np.abs(estimate - exact) <= (hi - lo) / 2 + slack)


def test_stops_are_honoured_and_greedy_is_the_same_for_every_seed(fleet):
    """Greedy (``top_k=1``) gives the same tokens for 4 seeds; with the greedy second token
    as a stop, generation ends there with ``finish_reason`` stop, the stop kept."""
    prompt = _prompts()[0]
    greedy = [fleet.generate([prompt], SamplingParams(top_k=1, max_new_tokens=8, seed=s))[0][0]
              for s in range(4)]
    tokens = greedy[0].response_ids.tolist()
    assert all(g.response_ids.tolist() == tokens for g in greedy) and len(tokens) == 8
    stop = tokens[1]
    (g,), = fleet.generate([prompt], SamplingParams(top_k=1, max_new_tokens=8,
                                                    stop_token_ids=(stop,)))
    first = tokens.index(stop)
    assert g.finish_reason == "stop" and g.response_ids.tolist() == tokens[:first + 1]


def test_pause_holds_requests_until_continue(fleet):
    """Requests sent while the server is paused (``in_place``) are held, and complete
    after ``resume``."""
    fleet.pause()
    try:
        with cf.ThreadPoolExecutor(1) as pool:
            fut = pool.submit(fleet.generate, [_prompts()[0]],
                              SamplingParams(max_new_tokens=4, seed=3))
            done, _ = cf.wait([fut], timeout=3.0)
            assert not done, "a request completed while the server was paused"
            fleet.resume()
            (g,), = fut.result(timeout=300)
    finally:
        fleet.resume()
    assert len(g.response_ids) == 4


def test_a_reload_that_kills_the_server_is_relaunched_on_the_new_checkpoint(engine_env, tmp_path):
    """The tiny Qwen2 (qkv biases): on SGLang's CPU path ``/update_weights_from_disk``
    kills the server (the repacked biases lose their ``weight_loader``). The fleet started
    it (`LocalServers`), so it relaunches it on the new checkpoint tagged version 1, and
    samples version 1 from it, matching the v1 model. On a GPU the reload succeeds and no
    relaunch is needed; the tokens are the same check."""
    python, device = engine_env
    qwen = ModelConfig.from_hf_config(json.loads((tiny_dir() / "config.json").read_text()))
    assert qwen.attention_bias
    models = [random_decoder(qwen, seed) for seed in (200, 201)]
    dirs = [export(m, tmp_path / f"qwen_v{v}") for v, m in enumerate(models)]
    cfg = SGLangLaunchConfig(model_path=dirs[0], device=device, base_port=_free_port(),
                             python=python, mem_fraction_static=0.05 if device == "cpu" else 0.2,
                             extra_args=("--max-total-tokens", "8192",
                                         "--disable-overlap-schedule"))
    (cmd,), (url,) = server_commands(cfg), server_urls(cfg)
    with LocalServers([cmd], [url], log_dir=str(tmp_path / "logs"), ready_timeout_s=900) as procs:
        procs.wait_ready()
        first = procs.procs[0]
        with fleet_over(url, str(tmp_path / "exports"), relaunch=procs.relaunch) as fleet:
            fleet.update_weights_from_path(dirs[1], 1)
            m = fleet.metrics()
            gens = [g for row in fleet.generate(_prompts(), PARAMS, num_samples=2) for g in row]
        log = open(tmp_path / "logs" / "server-0.log", errors="replace").read()
    figures = _compare(gens, models[1], models[0], version=1)
    if device == "cpu":
        assert "has no attribute 'weight_loader'" in log
        assert first.returncode is not None and m["sglang/servers_relaunched"] == 1
        assert m["sglang/weight_update_failures"] == 1 and m["sglang/weight_sync_outages"] == 0
    print(json.dumps({"relaunched": m["sglang/servers_relaunched"], **figures}))
