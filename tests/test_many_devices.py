"""The FSDP learner on many devices (the 8 fake CPU devices of tests/conftest.py): at the
Qwen2.5-0.5B widths each device holds 1/8 of the parameters and optimizer state (from the
sharded abstract state and from the compiled step's memory analysis), and two processes
of four devices run the one-process program to the same loss (benchmarks/compile.py)."""

import json
import os
import pathlib
import socket
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from benchmarks.compile import compile_learner, state_bytes
from benchmarks.learner import QWEN05
from entr_jax.model import Decoder, ModelConfig
from entr_jax.sharding import MeshConfig, make_mesh
from learners.optim import OptimizerConfig, make_optimizer
from learners.state import make_state_init

ROOT = pathlib.Path(__file__).resolve().parents[1]
# the 0.5B widths (hidden 896, 14/2 heads, intermediate 4864, vocabulary 151936), 2 layers
SHAPE = dict(QWEN05, num_layers=2)


def _replicated_bytes(abstract, shardings) -> int:
    leaves = jax.tree.leaves((abstract.params, abstract.opt_state))
    shard = jax.tree.leaves((shardings.params, shardings.opt_state))
    return sum(int(np.prod(a.shape)) * a.dtype.itemsize for a, s in zip(leaves, shard)
               if s.is_fully_replicated)


def test_each_device_holds_an_eighth_of_parameters_and_optimizer_state():
    assert jax.device_count() == 8
    cfg = ModelConfig(**SHAPE)
    mesh = make_mesh(MeshConfig(data=1, fsdp=8))
    init, shardings = make_state_init(
        lambda: Decoder(cfg, rngs=nnx.Rngs(0), dtype=jnp.bfloat16, param_dtype=jnp.bfloat16),
        make_optimizer(OptimizerConfig()), mesh)
    abstract = jax.eval_shape(init)  # nothing is materialised
    figures = state_bytes(abstract, shardings)
    replicated = _replicated_bytes(abstract, shardings)  # norm gains, biases, counters
    total = figures["params"]["total"] + figures["opt_state"]["total"]
    per_device = figures["params"]["per_device"] + figures["opt_state"]["per_device"]
    assert replicated < 1e-3 * total
    assert per_device == (total - replicated) // 8 + replicated
    assert figures["params"]["total"] == 2 * (151936 * 896 + 2 * 14_912_384 + 896)  # bf16


def test_the_compiled_step_takes_an_eighth_of_the_state_per_device():
    figures = compile_learner(SHAPE, batch=8, length=128, dtype="bf16")
    state = figures["state_bytes"]
    per_device = state["params"]["per_device"] + state["opt_state"]["per_device"]
    batch_per_device = figures["step_argument_bytes_per_device"] - per_device
    # the rest of the arguments is one row of the 8 x 128 batch (7 [1, 127] fields of 4
    # bytes, the [1, 128] tokens and mask) and the scalars
    assert 0 < batch_per_device < 8 * 128 * 4 * 2 + 1024


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _last_json(stdout: str) -> dict:
    """The JSON object a process printed last (gloo prints its own lines before it)."""
    return json.loads(stdout[stdout.rindex("\n{\n") + 1:] if not stdout.startswith("{\n")
                      else stdout)


def test_two_processes_of_four_devices_run_the_one_process_program():
    """The same FSDP step (0.5B widths, 1 layer, vocabulary 8192 to keep the CPU run short),
    one process of 8 devices here against 2 processes of 4 devices (gloo collectives):
    the same per-device bytes and the same loss and gradient norm to f32 rounding."""
    args = ["--layers", "1", "--vocab", "8192", "--batch", "8", "--seq-len", "128",
            "--dtype", "f32", "--run-step"]
    port = _free_port()
    procs = []
    for pid in range(2):
        env = dict(os.environ, JAX_PLATFORMS="cpu", ENTR_NUM_PROCESSES="2",
                   ENTR_PROCESS_ID=str(pid), ENTR_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                   XLA_FLAGS="--xla_force_host_platform_device_count=4")
        procs.append(subprocess.Popen(
            [sys.executable, str(ROOT / "benchmarks" / "compile.py"), *args], cwd=ROOT,
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    here = compile_learner(dict(SHAPE, num_layers=1, vocab_size=8192), batch=8, length=128,
                           dtype="f32", run_step=True)
    outs = []
    for p in procs:
        try:
            stdout, stderr = p.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("a process of the 2 x 4 run hung")
        assert p.returncode == 0, stderr[-3000:]
        outs.append(_last_json(stdout))
    for out in outs:
        assert out["processes"] == 2 and out["device"].startswith("cpu x8")
        assert out["state_bytes"] == here["state_bytes"]
        assert out["state_bytes_on_first_local_device"] == here["state_bytes_on_first_local_device"]
        assert out["step_argument_bytes_per_device"] == here["step_argument_bytes_per_device"]
        for key, value in here["step"].items():
            assert out["step"][key] == pytest.approx(value, rel=1e-5), key
