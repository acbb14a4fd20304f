"""Decoder core: masks, RoPE/RMSNorm goldens, KV-cache decode parity, dtypes, sharding."""

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from entr_jax.model import (
    LOGICAL_AXIS_RULES, Decoder, Llama3RopeScaling, ModelConfig, init_cache,
)
from entr_jax.model.layers import RMSNorm, rope_cos_sin, rope_inv_freq, rope_rotate

F32_TOL = 1e-5

CFG = ModelConfig(
    architecture="qwen3", vocab_size=98, hidden_size=32, intermediate_size=48, num_layers=2,
    num_heads=4, num_kv_heads=2, head_dim=8, rope_theta=100.0, qk_norm=True,
    tie_word_embeddings=False, max_position_embeddings=64,
)
LENGTHS = (7, 3, 5)  # right-padded rows of different lengths


@pytest.fixture(scope="module")
def model():
    m = Decoder(CFG, rngs=nnx.Rngs(0))
    # Larger weights than the 0.02 init so that every term moves the logits.
    state = nnx.state(m, nnx.Param)
    keys = iter(jax.random.split(jax.random.key(1), 64))
    state = jax.tree.map(lambda x: x + 0.3 * jax.random.normal(next(keys), x.shape), state)
    nnx.update(m, state)
    return m


@pytest.fixture(scope="module")
def batch():
    rng = np.random.RandomState(0)
    ids = rng.randint(0, CFG.vocab_size, (len(LENGTHS), max(LENGTHS))).astype(np.int32)
    mask = np.arange(max(LENGTHS))[None, :] < np.array(LENGTHS)[:, None]
    return jnp.asarray(ids), jnp.asarray(mask)


@pytest.fixture(scope="module")
def forward():
    return nnx.jit(lambda m, ids, mask: m(ids, mask))


def test_rms_norm_golden():
    norm = RMSNorm(3, 1e-6, "norm", dtype=jnp.float32, param_dtype=jnp.float32)
    norm.scale[...] = jnp.array([1.0, 2.0, 0.5])
    x = jnp.array([[3.0, 4.0, 0.0]])
    rms = math.sqrt((9 + 16) / 3 + 1e-6)
    np.testing.assert_allclose(norm(x), [[3 / rms, 8 / rms, 0.0]], rtol=1e-6)


def test_rope_golden():
    # head_dim 4, theta 100: w = [1, 0.1]; rotate-half pairs (0,2) and (1,3).
    cfg = ModelConfig("llama", 11, 8, 8, 1, 2, 2, 4, rope_theta=100.0)
    inv = rope_inv_freq(cfg)
    np.testing.assert_allclose(inv, [1.0, 0.1], rtol=1e-6)
    x = jnp.array([1.0, 2.0, 3.0, 4.0]).reshape(1, 1, 1, 4)
    p = 3
    out = rope_rotate(x, *rope_cos_sin(jnp.array([[p]]), inv)).reshape(4)
    c0, s0, c1, s1 = math.cos(3), math.sin(3), math.cos(0.3), math.sin(0.3)
    want = [1 * c0 - 3 * s0, 2 * c1 - 4 * s1, 3 * c0 + 1 * s0, 4 * c1 + 2 * s1]
    np.testing.assert_allclose(out, want, rtol=1e-5)


def test_rope_table_equals_direct_cos_sin_bit_for_bit():
    """`rope_cos_sin` read from a table of ``num_positions`` angles gives the values of
    evaluating cos and sin at each position, bit for bit, left-padded rows included."""
    inv = rope_inv_freq(ModelConfig("llama", 11, 16, 8, 1, 2, 2, 64, rope_theta=1e6))
    positions = jnp.asarray(np.random.RandomState(0).randint(0, 4096, (3, 257)), jnp.int32)
    positions = positions.at[0, :5].set(0).at[1].set(jnp.arange(257))
    table = jax.jit(lambda p: rope_cos_sin(p, inv, num_positions=4096))(positions)
    direct = jax.jit(lambda p: rope_cos_sin(p, inv))(positions)
    for got, want in zip(table, direct):
        assert got.shape == (3, 257, 1, 64) and got.dtype == jnp.float32
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    np.testing.assert_allclose(direct[0][1, 5, 0, :32], np.cos(5 * inv), rtol=1e-6)


def test_full_forward_backward_evaluates_rope_once(model, batch):
    """In the compiled value and gradient of the full forward, cos and sin are evaluated
    in at most two computations (XLA fuses the table's cos and sin into their lookups),
    each producing one ``[B, L, hd]`` array, not in the fusions that rotate each layer's
    queries and keys, forward and backward (6% of the benchmark learner step; 26
    computations on this model before)."""
    ids, mask = batch
    graphdef, params = nnx.split(model)

    def loss(p):
        return jnp.sum(nnx.merge(graphdef, p).hidden_states(ids, mask) ** 2)

    hlo = jax.jit(jax.grad(loss)).lower(params).compile().as_text()
    # One text block per computation: fused computations, the entry, loop bodies.
    with_trig = [c for c in re.split(r"\n(?=\S)", hlo) if re.search(r" (?:cosine|sine)\(", c)]
    assert 1 <= len(with_trig) <= 2, [c.splitlines()[0] for c in with_trig]
    for c in with_trig:
        root = re.search(r"ROOT \S+ = \w+\[([\d,]*)\]", c)
        assert root, c.splitlines()[0]
        size = int(np.prod([int(d) for d in root.group(1).split(",") if d]))
        assert size <= ids.shape[0] * ids.shape[1] * CFG.head_dim, c.splitlines()[0]


def test_llama3_inv_freq_bands():
    # head_dim 8, theta 1e4: w = [1, 0.1, 0.01, 0.001]; wavelengths 6.28, 62.8, 628, 6283.
    # L = 1000, low 1 -> 1000, high 4 -> 250: band high, high, medium, low.
    rs = Llama3RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                           original_max_position_embeddings=1000)
    cfg = ModelConfig("llama", 11, 16, 8, 1, 2, 2, 8, rope_theta=1e4, rope_scaling=rs)
    s = (1000 / (2 * math.pi / 0.01) - 1.0) / 3.0
    want = [1.0, 0.1, (1 - s) * 0.01 / 8 + s * 0.01, 0.001 / 8]
    np.testing.assert_allclose(rope_inv_freq(cfg), want, rtol=1e-5)


def test_call_is_lm_logits_of_hidden_states(model, batch):
    ids, mask = batch
    h = model.hidden_states(ids, mask)
    assert h.shape == (3, 7, CFG.hidden_size)
    logits = model(ids, mask)
    assert logits.dtype == jnp.float32 and logits.shape == (3, 7, CFG.vocab_size)
    np.testing.assert_array_equal(logits, model.lm_logits(h))
    # Chunked unembedding gives the same numbers.
    np.testing.assert_allclose(model.lm_logits(h[:, 2:4]), logits[:, 2:4], atol=F32_TOL)


def test_padding_never_leaks_into_real_tokens(model, batch, forward):
    ids, mask = batch
    base = forward(model, ids, mask)
    other = jnp.where(mask, ids, (ids + 17) % CFG.vocab_size)
    changed = forward(model, other, mask)
    m = np.asarray(mask)
    np.testing.assert_array_equal(np.asarray(base)[m], np.asarray(changed)[m])
    # ...while a row without padding sees its own tokens change the later logits.
    assert not np.allclose(np.asarray(base)[0, 1:], np.asarray(forward(model, ids.at[0, 0].set(
        (ids[0, 0] + 1) % CFG.vocab_size), mask))[0, 1:])


def test_right_padded_row_equals_unpadded_row(model, batch):
    ids, mask = batch
    full = model(ids, mask)
    for b, n in enumerate(LENGTHS):
        alone = model(ids[b:b + 1, :n])
        np.testing.assert_allclose(full[b, :n], alone[0], atol=F32_TOL)


def test_prefill_then_decode_matches_full_forward(model):
    rng = np.random.RandomState(1)
    steps, prompt_len = 4, max(LENGTHS)
    total = max(LENGTHS) + steps
    seqs = rng.randint(0, CFG.vocab_size, (len(LENGTHS), total)).astype(np.int32)
    lens = np.array(LENGTHS)
    full = np.asarray(model(jnp.asarray(seqs)))  # causal: rows are prefixes of themselves

    decode = nnx.jit(lambda m, i, p, c: m.decode(i, p, c))
    cache = init_cache(CFG, len(LENGTHS), total + 2, jnp.float32)
    prompt = np.where(np.arange(prompt_len)[None] < lens[:, None], seqs[:, :prompt_len], 0)
    pos = np.broadcast_to(np.arange(prompt_len, dtype=np.int32), prompt.shape)
    logits, cache = decode(model, jnp.asarray(prompt), jnp.asarray(pos), cache)
    for b, n in enumerate(LENGTHS):
        np.testing.assert_allclose(logits[b, :n], full[b, :n], atol=F32_TOL)
    rows = np.arange(len(LENGTHS))
    for t in range(steps):
        p = lens + t
        step_ids = seqs[rows, p][:, None]
        logits, cache = decode(model, jnp.asarray(step_ids), jnp.asarray(p[:, None], jnp.int32), cache)
        np.testing.assert_allclose(logits[:, 0], full[rows, p], atol=F32_TOL)
    n = CFG.num_layers
    assert cache.k.shape == (n, 3, CFG.num_kv_heads, CFG.head_dim, total + 2)
    assert cache.v.shape == (n, 3, CFG.num_kv_heads, total + 2, CFG.head_dim)


def test_decode_rejects_bad_shapes(model):
    cache = init_cache(CFG, 2, 8)
    with pytest.raises(ValueError, match="positions"):
        model.decode(jnp.zeros((2, 3), jnp.int32), jnp.zeros((2, 2), jnp.int32), cache)
    with pytest.raises(ValueError, match="cache"):
        model.decode(jnp.zeros((3, 1), jnp.int32), jnp.zeros((3, 1), jnp.int32), cache)
    with pytest.raises(ValueError, match="input_ids"):
        model(jnp.zeros((2, 3), jnp.float32))
    with pytest.raises(ValueError, match="attention_mask"):
        model(jnp.zeros((2, 3), jnp.int32), jnp.ones((2, 4), bool))
    with pytest.raises(ValueError, match="max_len"):
        init_cache(CFG, 2, 0)
    with pytest.raises(ValueError, match="param_dtype"):
        Decoder(CFG, rngs=nnx.Rngs(0), param_dtype=jnp.float16)


def test_bf16_smoke(model, batch):
    ids, mask = batch
    ref = np.asarray(model(ids, mask))
    m16 = Decoder(CFG, rngs=nnx.Rngs(0), dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)
    nnx.update(m16, jax.tree.map(lambda x: x.astype(jnp.bfloat16), nnx.state(model, nnx.Param)))
    assert m16.layers.attn.q_proj.kernel[...].dtype == jnp.bfloat16
    out = m16(ids, mask)
    assert out.dtype == jnp.float32
    got = np.asarray(out)[np.asarray(mask)]
    want = ref[np.asarray(mask)]
    assert np.isfinite(got).all()
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max()
    cache = init_cache(CFG, 3, 8, jnp.bfloat16)
    step, _ = m16.decode(ids[:, :1], jnp.zeros((3, 1), jnp.int32), cache)
    np.testing.assert_allclose(step[:, 0], out[:, 0], atol=0.02 * np.abs(want).max())


def test_logical_axes_and_sharded_forward(model, batch):
    state = nnx.state(model, nnx.Param)
    specs = nnx.get_partition_spec(state)
    layer = specs["layers"]
    assert layer["attn"]["q_proj"]["kernel"].get_value() == P("layers", "embed", "heads")
    assert layer["mlp"]["down_proj"]["kernel"].get_value() == P("layers", "mlp", "embed")
    assert layer["input_norm"]["scale"].get_value() == P("layers", "norm")
    assert specs["embed_tokens"]["embedding"].get_value() == P("vocab", "embed")
    assert specs["lm_head"].get_value() == P("vocab", "embed")
    assert specs["final_norm"]["scale"].get_value() == P("norm")
    mesh_specs = jax.tree.map(lambda s: nn.logical_to_mesh_axes(tuple(s), LOGICAL_AXIS_RULES),
                              specs, is_leaf=lambda x: isinstance(x, P))
    k_proj = mesh_specs["layers"]["attn"]["k_proj"]["kernel"].get_value()
    assert k_proj == P(None, "fsdp", "tensor")
    assert mesh_specs["layers"]["attn"]["o_proj"]["kernel"].get_value() == P(None, "tensor", "fsdp")
    assert mesh_specs["final_norm"]["scale"].get_value() == P(None)

    mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"),
                         axis_types=(jax.sharding.AxisType.Auto,) * 3)
    graphdef, _ = nnx.split(model)
    sharded = jax.tree.map(lambda x, s: jax.device_put(x, NamedSharding(mesh, s)), state, mesh_specs,
                           is_leaf=lambda x: isinstance(x, P))
    assert len(sharded["lm_head"][...].sharding.device_set) == 8
    ids, mask = batch
    ids4 = jnp.concatenate([ids, ids[:1]], axis=0)
    mask4 = jnp.concatenate([mask, mask[:1]], axis=0)
    data = NamedSharding(mesh, P(("data", "fsdp")))

    @jax.jit
    def fwd(st, i, m):
        return nnx.merge(graphdef, st)(i, m)

    out = fwd(sharded, jax.device_put(ids4, data), jax.device_put(mask4, data))
    np.testing.assert_allclose(out, model(ids4, mask4), atol=F32_TOL)
