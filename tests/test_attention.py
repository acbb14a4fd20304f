"""Causal query-blocked attention == the plain masked-softmax reference (values, gradients,
padding, GQA), the decode path's `attend` == the reference, the skipped upper triangle
shows in XLA's flop count, and a decode step copies no KV-cache-sized array."""

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from entr_jax.model import Decoder, ModelConfig, init_cache
from entr_jax.model import attention
from entr_jax.model.attention import attend, causal_attend, query_blocks

B, L, H, K, HD = 4, 7, 4, 2, 8
# Row 0 full, row 1 right-padded, row 2 left-padded, row 3 left- and right-padded.
VALID = np.array([
    [1, 1, 1, 1, 1, 1, 1],
    [1, 1, 1, 1, 0, 0, 0],
    [0, 0, 0, 1, 1, 1, 1],
    [0, 0, 1, 1, 1, 0, 0],
], bool)


def reference(q, k, v, mask):
    """Plain masked softmax attention (Vaswani et al. 2017, eq. 1), GQA head h -> h // (H/K):
    full [S, T] scores, masked entries set to f32 min, softmax over keys."""
    b, s, h, hd = q.shape
    rep = h // k.shape[2]
    k = jnp.repeat(k, rep, axis=2)
    v = jnp.repeat(v, rep, axis=2)
    scores = jnp.einsum("bshd,bthd->bhst", q, k) / math.sqrt(hd)
    scores = jnp.where(mask[:, None], scores, np.finfo(np.float32).min)
    return jnp.einsum("bhst,bthd->bshd", jax.nn.softmax(scores, -1), v).reshape(b, s, h * hd)


def causal_mask(valid):
    idx = np.arange(valid.shape[1])
    return (idx[:, None] >= idx[None, :])[None] & valid[:, None, :]


@pytest.fixture(scope="module")
def qkv():
    kq, kk, kv_, kw = jax.random.split(jax.random.key(0), 4)
    return (jax.random.normal(kq, (B, L, H, HD)), jax.random.normal(kk, (B, L, K, HD)),
            jax.random.normal(kv_, (B, L, K, HD)), jax.random.normal(kw, (B, L, H * HD)))


def test_query_blocks_hand_values():
    assert query_blocks(7, 2, 8) == [(0, 2), (2, 4), (4, 6), (6, 7)]
    assert query_blocks(7, 1, 3) == [(0, 3), (3, 6), (6, 7)]
    assert query_blocks(100) == [(0, 100)]
    assert query_blocks(1024) == [(s, s + 128) for s in range(0, 1024, 128)]
    assert query_blocks(4096) == [(s, s + 512) for s in range(0, 4096, 512)]
    with pytest.raises(ValueError, match="length"):
        query_blocks(0)


@pytest.mark.parametrize("min_block, max_blocks", [(2, 8), (1, 3), (128, 8)])
def test_causal_attend_matches_reference_values_and_grads(qkv, min_block, max_blocks):
    q, k, v, w = qkv
    valid = jnp.asarray(VALID)
    mask = causal_mask(VALID)
    readable = jnp.asarray(mask.any(-1))[:, :, None]  # rows with at least one key to read

    def loss_blocked(q, k, v):
        out = causal_attend(q, k, v, valid, jnp.float32, min_block=min_block, max_blocks=max_blocks)
        return jnp.sum(jnp.where(readable, out * w, 0.0)), out

    def loss_ref(q, k, v):
        out = reference(q, k, v, jnp.asarray(mask))
        return jnp.sum(jnp.where(readable, out * w, 0.0)), out

    (lb, out_b), grads_b = jax.jit(jax.value_and_grad(loss_blocked, (0, 1, 2), has_aux=True))(q, k, v)
    (lr, out_r), grads_r = jax.jit(jax.value_and_grad(loss_ref, (0, 1, 2), has_aux=True))(q, k, v)
    # Left-padding queries (row 2 positions 0-2, row 3 positions 0-1) read no key.
    assert int(readable.sum()) == B * L - 5
    diff = np.abs(np.asarray(out_b) - np.asarray(out_r))[np.asarray(readable)[..., 0]]
    assert diff.max() < 1e-5
    assert np.isfinite(np.asarray(out_b)).all()
    assert abs(float(lb) - float(lr)) < 1e-4
    for gb, gr in zip(grads_b, grads_r):
        assert np.abs(np.asarray(gb) - np.asarray(gr)).max() < 1e-5
        assert np.abs(np.asarray(gr)).max() > 1e-2  # the gradient is not trivially zero
    # A padding key never receives gradient (it is never read).
    pad_keys = ~VALID
    assert np.abs(np.asarray(grads_b[1]))[pad_keys].max() == 0.0
    assert np.abs(np.asarray(grads_b[2]))[pad_keys].max() == 0.0


def test_attend_matches_reference_under_any_mask(qkv):
    """The decode path's explicit-mask `attend` (cache slots <= position) == the reference."""
    q, k, v, _ = qkv
    mask = np.random.RandomState(0).rand(B, L, L) < 0.6
    mask[:, :, 0] = True  # every row reads a key
    out = jax.jit(attend, static_argnums=4)(q, k, v, jnp.asarray(mask), jnp.float32)
    expected = jax.jit(reference)(q, k, v, jnp.asarray(mask))
    assert np.abs(np.asarray(out) - np.asarray(expected)).max() < 1e-5


def test_causal_attend_rejects_mismatched_shapes(qkv):
    q, k, v, _ = qkv
    with pytest.raises(ValueError, match="must share"):
        causal_attend(q, k[:, :5], v[:, :5], jnp.asarray(VALID), jnp.float32)


def test_upper_triangle_is_not_computed():
    """XLA's flop count of forward + backward at L = 1024 (8 blocks of 128): the blocked
    form does (n + 1) / (2 n) = 9/16 of the score work; the masked reference does it all."""
    b, length, h, kv, hd = 1, 1024, 2, 1, 16
    q = jnp.zeros((b, length, h, hd))
    k = v = jnp.zeros((b, length, kv, hd))
    valid = jnp.ones((b, length), bool)

    def flops(fn):
        grad = jax.grad(lambda q, k, v: jnp.sum(fn(q, k, v)), argnums=(0, 1, 2))
        cost = jax.jit(grad).lower(q, k, v).compile().cost_analysis()
        return float((cost[0] if isinstance(cost, (list, tuple)) else cost)["flops"])

    blocked = flops(lambda q, k, v: causal_attend(q, k, v, valid, jnp.float32))
    full = flops(lambda q, k, v: attend(q, k, v, jnp.asarray(causal_mask(np.ones((b, length), bool))),
                                        jnp.float32))
    assert 0.5 < blocked / full < 0.62


CFG = ModelConfig(
    architecture="qwen2", vocab_size=50, hidden_size=32, intermediate_size=48, num_layers=1,
    num_heads=4, num_kv_heads=2, head_dim=8, attention_bias=True, max_position_embeddings=64,
)


def test_decoder_blocked_equals_single_block_with_padding(monkeypatch):
    """The whole decoder with 4 query blocks (left/right padding, GQA, RoPE) == one block
    (the masked reference), logits and parameter gradients on real tokens."""
    model = Decoder(CFG, rngs=nnx.Rngs(0))
    state = nnx.state(model, nnx.Param)
    keys = iter(jax.random.split(jax.random.key(1), 64))
    nnx.update(model, jax.tree.map(lambda x: x + 0.3 * jax.random.normal(next(keys), x.shape), state))
    graphdef, params = nnx.split(model)
    ids = jnp.asarray(np.random.RandomState(0).randint(0, CFG.vocab_size, (B, L)), jnp.int32)
    valid = jnp.asarray(VALID)
    w = jax.random.normal(jax.random.key(2), (B, L, CFG.vocab_size))

    def loss(p):
        logits = nnx.merge(graphdef, p)(ids, valid)
        return jnp.sum(jnp.where(valid[..., None], logits * w, 0.0)), logits

    def run(min_block):
        monkeypatch.setattr(attention, "MIN_BLOCK", min_block)
        # A fresh jit per call: the blocking is read when tracing.
        return jax.jit(jax.value_and_grad(lambda p: loss(p), has_aux=True))(params)

    (_, logits_blocked), grads_blocked = run(2)
    (_, logits_one), grads_one = run(128)
    m = np.asarray(VALID)
    assert np.abs(np.asarray(logits_blocked) - np.asarray(logits_one))[m].max() < 1e-4
    for gb, go in zip(jax.tree.leaves(grads_blocked), jax.tree.leaves(grads_one)):
        assert np.abs(np.asarray(gb) - np.asarray(go)).max() < 1e-4 * max(1.0, np.abs(np.asarray(go)).max())


def _big_layout_copies(hlo: str, min_elements: int) -> list[str]:
    """copy / transpose instructions of at least ``min_elements`` elements in an HLO text."""
    out = []
    for line in hlo.splitlines():
        m = re.search(r"= \w+\[([\d,]+)\]\{[^}]*\} (copy|transpose)\(", line)
        if m and np.prod([int(d) for d in m.group(1).split(",")]) >= min_elements:
            out.append(line.strip())
    return out


def test_decode_step_reads_the_kv_cache_without_copying_it():
    """One cached decode step: the heads-first cache (keys [B, K, hd, M], values
    [B, K, M, hd]) feeds both attention products as is
    (the former [B, M, K, hd] layout cost two full-cache transposes per layer per step)."""
    model = Decoder(CFG, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    batch, slots = 2, 64
    cache = init_cache(CFG, batch, slots)
    assert cache.k[0].shape == (batch, CFG.num_kv_heads, CFG.head_dim, slots)
    assert cache.v[0].shape == (batch, CFG.num_kv_heads, slots, CFG.head_dim)

    def step(p, cache, ids, positions):
        return nnx.merge(graphdef, p).decode(ids, positions, cache)

    ids = jnp.zeros((batch, 1), jnp.int32)
    positions = jnp.full((batch, 1), 5, jnp.int32)
    hlo = jax.jit(step, donate_argnums=1).lower(params, cache, ids, positions).compile().as_text()
    assert _big_layout_copies(hlo, cache.k[0].size) == []


def _grad_hlo(b, length, h, kv, hd):
    q = jnp.ones((b, length, h, hd))
    k = v = jnp.ones((b, length, kv, hd))
    valid = jnp.ones((b, length), bool)
    grad = jax.grad(lambda q, k, v: jnp.sum(causal_attend(q, k, v, valid, jnp.float32) ** 2),
                    argnums=(0, 1, 2))
    return jax.jit(grad).lower(q, k, v).compile().as_text()


def test_backward_transposes_no_score_sized_array():
    """The backward pass reads the score-sized P and dS in their own layout: the key and
    value gradients are formed as (Q^T dS)^T and (dO^T P)^T (`attention._attend_vjp`).
    Through plain autodiff XLA:CPU wrote dS transposed for dS^T Q, column by column (12% of
    the benchmark learner step's op time on a 2-core Xeon)."""
    b, length, h, kv, hd = 2, 256, 6, 2, 16  # blocks of 128 queries: [2, 2, 3, 128, <= 256]
    smallest_block = b * kv * (h // kv) * 128 * 128
    assert _big_layout_copies(_grad_hlo(b, length, h, kv, hd), smallest_block) == []


def test_backward_pads_no_full_length_array():
    """Each query block reads its key and value segments through a concatenation of split
    segments, whose transposes are slices and a concatenation. Slicing ``k[:, :s1]`` per
    block instead transposed into a zero pad to full length per block and gradient (10 pads
    at 4 blocks here; 5% of the benchmark learner step)."""
    hlo = _grad_hlo(2, 512, 6, 2, 16)  # blocks of 128 queries: 4 blocks
    pads = [line.strip() for line in hlo.splitlines()
            if re.search(r"= \w+\[[\d,]+\]\{[^}]*\} pad\(", line)]
    assert pads == []


def test_attention_vjp_equals_autodiff_in_float32_and_bfloat16(qkv):
    """The hand-written backward of `_softmax_attend` equals reverse-mode autodiff of the
    same forward (`_probs_values(_probs(...))`), masked and fully masked rows included."""
    q, k, v, w = qkv
    qh = attention._heads_first(q, K)
    kh, vh = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
    mask = jnp.asarray(causal_mask(VALID))[:, None, None]

    def autodiff(qh, kh, vh, dtype):
        return attention._probs_values(attention._probs(qh, kh, mask), vh, dtype)

    def custom(qh, kh, vh, dtype):
        return attention._softmax_attend(qh, kh, vh, mask, dtype)

    weights = attention._heads_first(w.reshape(B, L, H, HD), K)
    for dtype, tol in ((jnp.float32, 1e-5), (jnp.bfloat16, 3e-2)):
        args = tuple(x.astype(dtype) for x in (qh, kh, vh))

        def loss(fn):
            return lambda *a: jnp.sum(fn(*a, dtype).astype(jnp.float32) * weights)

        got = jax.grad(loss(custom), argnums=(0, 1, 2))(*args)
        want = jax.grad(loss(autodiff), argnums=(0, 1, 2))(*args)
        for g, r in zip(got, want):
            assert g.dtype == r.dtype == dtype
            g, r = np.asarray(g, np.float32), np.asarray(r, np.float32)
            assert np.abs(r).max() > 1e-2
            np.testing.assert_allclose(g, r, atol=tol * np.abs(r).max(), rtol=0)
