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
    (`experiments.run.main`), with tyro's box drawing removed and whitespace collapsed."""
    import re

    from experiments import run as cli

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
