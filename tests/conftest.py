"""Test setup: 8 fake CPU devices (set before jax is imported), strict rank promotion, and
the fixtures shared by several test modules."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("ENTR_JAX_CACHE", "0")  # entr-run's compilation cache: not in tests

import jax  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")


import json  # noqa: E402
import shutil  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def small_model_dir(tmp_path_factory):
    """A 2-layer Qwen2 checkpoint with the embedded tokenizer (vocabulary 1024)."""
    from flax import nnx

    from entr_jax.assets import tiny_dir
    from entr_jax.model import Decoder, ModelConfig, save_pretrained

    path = tmp_path_factory.mktemp("small_model")
    hf = json.loads((tiny_dir() / "config.json").read_text())
    hf.update(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    model = Decoder(ModelConfig.from_hf_config(hf), rngs=nnx.Rngs(0))
    save_pretrained(model, path)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(tiny_dir() / name, path / name)
    return path


@pytest.fixture
def servers():
    """``make(n=2, **kw) -> [FakeSGLangServer]``: fake SGLang servers on loopback
    (`tests.sglang_fake_server`), stopped after the test."""
    from tests.sglang_fake_server import FakeSGLangServer

    made = []

    def make(n=2, **kw):
        new = [FakeSGLangServer(**kw) for _ in range(n)]
        made.extend(new)
        return new

    yield make
    for s in made:
        s.stop()


@pytest.fixture(scope="module")
def fleet_reference():
    """Fault-free results of the first generate call of a fresh fleet (weights seed 0) on
    the fleet tests' prompts (`tests.sglang_fake_server.PROMPTS`), 2 samples each."""
    from samplers.sglang_fleet import SGLangFleet
    from tests.sglang_fake_server import PROMPTS, FakeSGLangServer, fleet_config, sampling_params

    server = FakeSGLangServer()
    try:
        with SGLangFleet(fleet_config([server])) as fleet:
            return fleet.generate(PROMPTS, sampling_params(), num_samples=2)
    finally:
        server.stop()


@pytest.fixture
def entr_run(capsys):
    """``entr_run(argv) -> (exit status, stderr)``: the command line as a user runs it
    (`experiments.run.cli.main`), with tyro's box drawing removed and whitespace collapsed."""
    import re

    from experiments.run import cli

    def call(argv):
        try:
            code = cli.main(argv)
        except SystemExit as e:  # tyro's own parse errors
            code = e.code
        err = capsys.readouterr().err
        return code, " ".join(re.sub(r"[│╭╮╰╯─]", " ", err).split())

    return call


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    """An empty ``ENTR_DATA_DIR`` (with a ``gsm8k/`` folder) whose files the test writes."""
    root = tmp_path / "data"
    (root / "gsm8k").mkdir(parents=True)
    monkeypatch.setenv("ENTR_DATA_DIR", str(root))
    return root


def _random_trajectories(n, seed=0, *, vocab=24, prompt_len=(1, 5), response_len=(1, 9),
                         scale=3.0, version=None, versions=3, keep=0.8):
    """``n`` random trajectories and ``[n] f32`` advantages, all drawn from
    ``np.random.default_rng(seed)`` in a fixed order (per trajectory: prompt length,
    response length, prompt ids, response ids, ``logp_mu``, ``entropy_mu``, then the drawn
    fields below; the advantages last), so a seed names one batch.

    Args:
      vocab: token ids are drawn from ``[0, vocab)``.
      prompt_len, response_len: ``[low, high)`` of the lengths.
      scale: ``logp_mu = -scale * U - 0.5``, ``entropy_mu = scale * U`` (``U ~ [0, 1)``).
      version: every token's ``token_version`` (nothing drawn), or None: drawn from
        ``[0, versions)``.
      keep: ``loss_mask`` true with this probability (drawn), or None: all true.
    """
    import numpy as np

    from entr_jax.types import Trajectory

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        p, r = int(rng.integers(*prompt_len)), int(rng.integers(*response_len))
        prompt = rng.integers(0, vocab, p).astype(np.int32)
        response = rng.integers(0, vocab, r).astype(np.int32)
        logp_mu = (-scale * rng.random(r) - 0.5).astype(np.float32)
        entropy_mu = (scale * rng.random(r)).astype(np.float32)
        token_version = (rng.integers(0, versions, r).astype(np.int32) if version is None
                         else np.full(r, version, np.int32))
        loss_mask = np.ones(r, bool) if keep is None else rng.random(r) < keep
        out.append(Trajectory(prompt_ids=prompt, response_ids=response, logp_mu=logp_mu,
                              entropy_mu=entropy_mu, token_version=token_version,
                              loss_mask=loss_mask))
    return out, rng.normal(size=n).astype(np.float32)


@pytest.fixture(scope="session")
def random_trajectories():
    """``make(n, seed=0, **kw) -> (trajectories, advantages)``: random episodes for the
    tiny policy's vocabulary of 24 (`_random_trajectories` documents the knobs)."""
    return _random_trajectories


@pytest.fixture(scope="session")
def tiny_policy():
    """``module_fn() -> Decoder``: a one-layer Qwen2-shaped policy (vocabulary 24, hidden
    16, two heads sharing one KV head, biases on q/k/v) initialised from ``nnx.Rngs(0)``;
    every call builds the same weights."""
    from flax import nnx

    from entr_jax.model import Decoder, ModelConfig

    cfg = ModelConfig(architecture="qwen2", vocab_size=24, hidden_size=16,
                      intermediate_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                      head_dim=8, attention_bias=True)
    return lambda: Decoder(cfg, rngs=nnx.Rngs(0))


@pytest.fixture
def unpackaged(monkeypatch):
    """``unpackaged(*keys)``: the registry entries of those data files (``gsm8k/test.jsonl``)
    lose their packaged copy for this test, as on an install that ships only some files, so
    the lookup goes on to the user cache and the download."""
    import dataclasses

    from entr_jax.data import registry

    def drop(*keys):
        for key in keys:
            monkeypatch.setitem(registry.FILES, key,
                                dataclasses.replace(registry.FILES[key], packaged=None,
                                                    packaged_sha256=None))

    return drop
