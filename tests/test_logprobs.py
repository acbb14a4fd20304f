"""Tests for entr_jax.logprobs: chunked log-prob + entropy against references and goldens.

Tolerance: 1e-5 (absolute and relative) for f32 ops, as design.md sets it.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from entr_jax.logprobs import (
    LOGP_OUTSIDE_KEPT,
    chunked_logprobs_entropy,
    logprobs_entropy_from_logits,
    naive_logprobs_entropy,
    token_logprobs_entropy,
)

TOL = 1e-5
B, T, D, V = 3, 7, 5, 11  # distinct sizes so a transposed axis fails


@pytest.fixture(scope="module")
def data():
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    hidden = jax.random.normal(k1, (B, T, D), jnp.float32)
    w = jax.random.normal(k2, (D, V), jnp.float32) * 2.0
    targets = jax.random.randint(k3, (B, T), 0, V, jnp.int32)
    return hidden, w, targets


def numpy_reference(logits, targets, temperature=1.0):
    """float64 log-softmax and -sum p log p, written independently of the library."""
    z = np.asarray(logits, np.float64) / temperature
    z = z - z.max(-1, keepdims=True)
    logq = z - np.log(np.exp(z).sum(-1, keepdims=True))
    p = np.exp(logq)
    logp = np.take_along_axis(logq, np.asarray(targets)[..., None], -1)[..., 0]
    entropy = -(p * logq).sum(-1)
    return logp, entropy


def test_hand_computed_golden():
    # softmax([0, log 3]) = [1/4, 3/4]
    logits = jnp.array([[[0.0, math.log(3.0)], [0.0, math.log(3.0)]]], jnp.float32)
    targets = jnp.array([[1, 0]], jnp.int32)
    logp, ent = naive_logprobs_entropy(logits, targets)
    h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    np.testing.assert_allclose(logp, [[math.log(0.75), math.log(0.25)]], rtol=TOL, atol=TOL)
    np.testing.assert_allclose(ent, [[h, h]], rtol=TOL, atol=TOL)
    # Same numbers through the chunked path with an identity unembedding.
    logp_c, ent_c = chunked_logprobs_entropy(logits, targets, lambda x: x, chunk_size=1)
    np.testing.assert_allclose(logp_c, logp, rtol=TOL, atol=TOL)
    np.testing.assert_allclose(ent_c, ent, rtol=TOL, atol=TOL)


@pytest.mark.parametrize("chunk_size", [1, 3, 7, 128])  # 3 does not divide T = 7
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_matches_naive_and_numpy(data, chunk_size, temperature):
    hidden, w, targets = data
    logits = hidden @ w
    logp, ent = chunked_logprobs_entropy(
        hidden, targets, lambda h: h @ w, chunk_size=chunk_size, temperature=temperature
    )
    assert logp.shape == (B, T) and ent.shape == (B, T)
    assert logp.dtype == jnp.float32 and ent.dtype == jnp.float32
    ref_logp, ref_ent = naive_logprobs_entropy(logits, targets, temperature=temperature)
    np.testing.assert_allclose(logp, ref_logp, rtol=TOL, atol=TOL)
    np.testing.assert_allclose(ent, ref_ent, rtol=TOL, atol=TOL)
    np_logp, np_ent = numpy_reference(logits, targets, temperature)
    np.testing.assert_allclose(ref_logp, np_logp, rtol=TOL, atol=TOL)
    np.testing.assert_allclose(ref_ent, np_ent, rtol=TOL, atol=TOL)


def test_temperature_changes_values(data):
    hidden, w, targets = data
    _, ent_1 = chunked_logprobs_entropy(hidden, targets, lambda h: h @ w, chunk_size=3)
    _, ent_hot = chunked_logprobs_entropy(
        hidden, targets, lambda h: h @ w, chunk_size=3, temperature=2.0
    )
    # A hotter distribution has strictly higher entropy (logits are not constant).
    assert bool(jnp.all(ent_hot > ent_1))


def test_uniform_entropy_is_log_v():
    logits = jnp.full((2, 5, V), 3.25, jnp.float32)
    targets = jnp.zeros((2, 5), jnp.int32)
    logp, ent = chunked_logprobs_entropy(logits, targets, lambda x: x, chunk_size=2)
    np.testing.assert_allclose(ent, np.full((2, 5), math.log(V)), rtol=TOL, atol=TOL)
    np.testing.assert_allclose(logp, np.full((2, 5), -math.log(V)), rtol=TOL, atol=TOL)


def test_one_hot_logits_zero_entropy_and_finite():
    logits = np.zeros((1, 4, V), np.float32)
    logits[0, 0, 2] = 1e4  # dominant token, huge margin
    logits[0, 1, :] = -np.inf  # masked vocabulary except one entry
    logits[0, 1, 5] = 0.0
    logits[0, 2, :] = 1e30  # large, all equal -> uniform
    logits[0, 3, :] = -np.inf  # two surviving entries with equal logits -> log 2
    logits[0, 3, [1, 7]] = -50.0
    targets = jnp.array([[2, 5, 0, 7]], jnp.int32)
    for fn in (
        lambda: naive_logprobs_entropy(jnp.asarray(logits), targets),
        lambda: chunked_logprobs_entropy(jnp.asarray(logits), targets, lambda x: x, chunk_size=3),
    ):
        logp, ent = fn()
        assert bool(jnp.all(jnp.isfinite(logp))) and bool(jnp.all(jnp.isfinite(ent)))
        np.testing.assert_allclose(ent, [[0.0, 0.0, math.log(V), math.log(2.0)]], atol=TOL)
        np.testing.assert_allclose(logp, [[0.0, 0.0, -math.log(V), -math.log(2.0)]], atol=TOL)


def test_entropy_counts_masked_entries_as_zero_bit_for_bit():
    """The entropy's ``sum p * shifted`` skips ``-inf`` entries by raising them to the f32
    minimum (``p = 0`` there): bit for bit the value of the explicit
    ``where(isfinite(shifted), shifted, 0)`` form, on rows with and without masked entries."""
    k1, k2 = jax.random.split(jax.random.key(3))
    logits = 4.0 * jax.random.normal(k1, (6, 257), jnp.float32)
    masked = jax.random.uniform(k2, (6, 257)) < jnp.array([0.0, 0.3, 0.9, 0.99, 0.5, 0.0])[:, None]
    logits = jnp.where(masked, -jnp.inf, logits).at[:, 0].set(1.0)  # entry 0 never masked
    targets = jnp.zeros((6,), jnp.int32)

    def where_form(z):
        shifted = z - jnp.max(z, axis=-1, keepdims=True)
        e = jnp.exp(shifted)
        lse = jnp.log(jnp.sum(e, axis=-1))
        probs = e / jnp.exp(lse)[..., None]
        return jnp.maximum(lse - jnp.sum(probs * jnp.where(jnp.isfinite(shifted), shifted, 0.0), axis=-1), 0.0)

    _, ent = jax.jit(logprobs_entropy_from_logits)(logits, targets)
    want = jax.jit(where_form)(logits)
    assert bool(jnp.all(jnp.isfinite(ent))) and float(jnp.max(ent)) > 1.0
    np.testing.assert_array_equal(np.asarray(ent), np.asarray(want))


def test_gradients_match_naive(data):
    hidden, w, targets = data
    weights = jnp.arange(B * T, dtype=jnp.float32).reshape(B, T) / (B * T) - 0.3

    def chunked_loss(h, w_):
        logp, _ = chunked_logprobs_entropy(h, targets, lambda x: x @ w_, chunk_size=3)
        return jnp.sum(weights * logp)

    def naive_loss(h, w_):
        logp, _ = naive_logprobs_entropy(h @ w_, targets)
        return jnp.sum(weights * logp)

    g_chunk = jax.grad(chunked_loss, argnums=(0, 1))(hidden, w)
    g_naive = jax.grad(naive_loss, argnums=(0, 1))(hidden, w)
    for a, b in zip(g_chunk, g_naive):
        assert float(jnp.max(jnp.abs(b))) > 1e-3  # the gradient is not trivially zero
        np.testing.assert_allclose(a, b, rtol=TOL, atol=TOL)
    g_jit = jax.jit(jax.grad(chunked_loss, argnums=(0, 1)))(hidden, w)
    for a, b in zip(g_jit, g_naive):
        np.testing.assert_allclose(a, b, rtol=TOL, atol=TOL)


def test_entropy_is_detached(data):
    hidden, w, targets = data

    def ent_sum(h, w_):
        _, ent = chunked_logprobs_entropy(h, targets, lambda x: x @ w_, chunk_size=3)
        return jnp.sum(ent)

    gh, gw = jax.grad(ent_sum, argnums=(0, 1))(hidden, w)
    assert float(jnp.max(jnp.abs(gh))) == 0.0 and float(jnp.max(jnp.abs(gw))) == 0.0


def test_sharded_batch_matches_single_device():
    n = len(jax.devices())
    k1, k2, k3 = jax.random.split(jax.random.key(1), 3)
    hidden = jax.random.normal(k1, (n, 5, D), jnp.float32)
    w = jax.random.normal(k2, (D, V), jnp.float32)
    targets = jax.random.randint(k3, (n, 5), 0, V, jnp.int32)
    mesh = jax.make_mesh((n,), ("data",))
    spec = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    fn = jax.jit(lambda h, y: chunked_logprobs_entropy(h, y, lambda x: x @ w, chunk_size=2))
    sharded = fn(jax.device_put(hidden, spec), jax.device_put(targets, spec))
    single = naive_logprobs_entropy(hidden @ w, targets)
    for a, b in zip(sharded, single):
        np.testing.assert_allclose(a, b, rtol=TOL, atol=TOL)


def test_chunked_backward_memory_below_naive():
    b, t, d, v, chunk = 2, 512, 16, 4096, 32
    hidden = jax.ShapeDtypeStruct((b, t, d), jnp.float32)
    w = jax.ShapeDtypeStruct((d, v), jnp.float32)
    targets = jax.ShapeDtypeStruct((b, t), jnp.int32)

    def chunked(h, w_, y):
        logp, ent = chunked_logprobs_entropy(h, y, lambda x: x @ w_, chunk_size=chunk)
        return jnp.sum(logp) + jnp.sum(ent)

    def naive(h, w_, y):
        logp, ent = naive_logprobs_entropy(h @ w_, y)
        return jnp.sum(logp) + jnp.sum(ent)

    def temp_bytes(f):
        grad_fn = jax.jit(jax.value_and_grad(f, argnums=(0, 1)))
        return grad_fn.lower(hidden, w, targets).compile().memory_analysis().temp_size_in_bytes

    full_logits = 4 * b * t * v  # 16 MiB
    chunk_logits = 4 * b * chunk * v  # 1 MiB
    naive_temp, chunked_temp = temp_bytes(naive), temp_bytes(chunked)
    assert naive_temp >= 2 * full_logits  # logits and their cotangent both live
    # The chunked peak is a few chunk-sized buffers, independent of T.
    assert chunked_temp < 6 * chunk_logits
    assert chunked_temp < naive_temp / 8


def test_token_logprobs_entropy_alignment():
    """A stand-in model whose logits are a lookup of the current token: index t must
    score tokens[:, t + 1] under the distribution produced at position t."""
    table = jax.random.normal(jax.random.key(2), (V, V), jnp.float32)

    class LookupModel:
        def hidden_states(self, input_ids, attention_mask=None):
            return jax.nn.one_hot(input_ids, V, dtype=jnp.float32)

        def lm_logits(self, hidden):
            return hidden @ table

    tokens = jnp.array([[1, 4, 2, 9, 0, 0], [3, 3, 10, 5, 7, 8]], jnp.int32)
    mask = tokens > 0
    logp, ent = token_logprobs_entropy(LookupModel(), tokens, mask, chunk_size=4)
    assert logp.shape == (2, 5) and ent.shape == (2, 5)
    ref_logp, ref_ent = numpy_reference(np.asarray(table)[np.asarray(tokens[:, :-1])], tokens[:, 1:])
    np.testing.assert_allclose(logp, ref_logp, rtol=TOL, atol=TOL)
    np.testing.assert_allclose(ent, ref_ent, rtol=TOL, atol=TOL)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(chunk_size=0), "chunk_size"),
        (dict(temperature=0.0), "temperature"),
        (dict(temperature=-1.0), "temperature"),
    ],
)
def test_bad_arguments(data, kwargs, match):
    hidden, w, targets = data
    with pytest.raises(ValueError, match=match):
        chunked_logprobs_entropy(hidden, targets, lambda h: h @ w, **kwargs)


def test_bad_shapes(data):
    hidden, w, targets = data
    with pytest.raises(ValueError, match="targets"):
        chunked_logprobs_entropy(hidden, targets[:, :-1], lambda h: h @ w)
    with pytest.raises(ValueError, match="hidden"):
        chunked_logprobs_entropy(hidden[0], targets, lambda h: h @ w)
    with pytest.raises(ValueError, match="integer"):
        chunked_logprobs_entropy(hidden, targets.astype(jnp.float32), lambda h: h @ w)
    with pytest.raises(ValueError, match="targets"):
        naive_logprobs_entropy(hidden @ w, targets[:1])
    with pytest.raises(ValueError, match="tokens"):
        token_logprobs_entropy(object(), targets[:, :1], None)
    with pytest.raises(ValueError, match="attention_mask"):
        token_logprobs_entropy(object(), targets, targets[:, :-1] > 0)


# ---------------------------------------------------------------------------------------
# Model level: entr_jax.model.Decoder built from the embedded tiny Qwen2 config (shrunk so
# the CPU suite stays fast), against its own full logits and against HF transformers.
# ---------------------------------------------------------------------------------------

MODEL_TOL = 1e-4  # design.md: model-level logits


@pytest.fixture(scope="module")
def tiny_model():
    import json

    from flax import nnx

    from entr_jax.assets import tiny_dir
    from entr_jax.model import Decoder, ModelConfig

    hf = json.loads((tiny_dir() / "config.json").read_text())
    hf.update(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    model = Decoder(ModelConfig.from_hf_config(hf), rngs=nnx.Rngs(0))
    vocab = hf["vocab_size"]
    tokens = jax.random.randint(jax.random.key(3), (2, 9), 4, vocab, jnp.int32)
    tokens = tokens.at[1, 6:].set(hf["pad_token_id"])
    mask = jnp.arange(9)[None, :] < jnp.array([[9], [6]])
    return model, tokens, mask


def test_model_chunked_matches_full_logits_values_and_grads(tiny_model):
    from flax import nnx

    model, tokens, mask = tiny_model
    weights = mask[:, 1:].astype(jnp.float32) * jnp.linspace(0.5, 1.5, 8)[None, :]

    @nnx.jit
    def chunked(m):
        return token_logprobs_entropy(m, tokens, mask, chunk_size=3)

    @nnx.jit
    def full(m):
        return naive_logprobs_entropy(m(tokens, mask)[:, :-1], tokens[:, 1:])

    for a, b in zip(chunked(model), full(model)):
        assert a.shape == (2, 8)
        np.testing.assert_allclose(a, b, rtol=TOL, atol=TOL)

    grad_chunked = nnx.jit(nnx.grad(lambda m: jnp.sum(weights * chunked(m)[0])))(model)
    grad_full = nnx.jit(nnx.grad(lambda m: jnp.sum(weights * full(m)[0])))(model)
    leaves_c, leaves_f = jax.tree.leaves(grad_chunked), jax.tree.leaves(grad_full)
    assert len(leaves_c) == len(leaves_f) > 0
    for a, b in zip(leaves_c, leaves_f):
        np.testing.assert_allclose(a, b, rtol=MODEL_TOL, atol=TOL)
    embed_grad = grad_chunked.embed_tokens.embedding[...]
    assert float(jnp.max(jnp.abs(embed_grad))) > 1e-3  # tied unembedding receives gradient


def test_model_matches_transformers(tiny_model, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from entr_jax.model import save_pretrained

    model, tokens, mask = tiny_model
    save_pretrained(model, str(tmp_path))
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32)
    hf_model.eval()
    with torch.no_grad():
        logits = hf_model(
            input_ids=torch.tensor(np.asarray(tokens), dtype=torch.long),
            attention_mask=torch.tensor(np.asarray(mask), dtype=torch.long),
        ).logits.numpy()
    ref_logp, ref_ent = numpy_reference(logits[:, :-1], np.asarray(tokens[:, 1:]))
    logp, ent = token_logprobs_entropy(model, tokens, mask, chunk_size=4)
    valid = np.asarray(mask[:, 1:])  # padding targets are meaningless by contract
    np.testing.assert_allclose(np.asarray(logp)[valid], ref_logp[valid], rtol=MODEL_TOL, atol=MODEL_TOL)
    np.testing.assert_allclose(np.asarray(ent)[valid], ref_ent[valid], rtol=MODEL_TOL, atol=MODEL_TOL)


# ---- sampling filters: the learner scores the filtered distribution the sampler drew from


def test_filtered_hand_computed_golden():
    """z = [log 4, log 3, log 2, log 1] (probabilities 0.4, 0.3, 0.2, 0.1).

    top_k 2 -> {0, 1} renormalised: 4/7, 3/7; top_p 0.75 keeps 0, 1 (mass before token 2
    is 0.7 < 0.75) and 2: 4/9, 3/9, 2/9; min_p 0.3 keeps p >= 0.12: 0, 1, 2 as well."""
    logits = jnp.log(jnp.array([[[4.0, 3.0, 2.0, 1.0]] * 4], jnp.float32))
    targets = jnp.array([[0, 1, 2, 3]], jnp.int32)
    logp, ent = naive_logprobs_entropy(logits, targets, top_k=2)
    lp2 = [math.log(4 / 7), math.log(3 / 7)]
    np.testing.assert_allclose(logp[0, :2], lp2, atol=TOL)
    np.testing.assert_allclose(logp[0, 2:], [LOGP_OUTSIDE_KEPT] * 2)  # probability 0
    np.testing.assert_allclose(ent, [[-(4 / 7) * lp2[0] - (3 / 7) * lp2[1]] * 4], atol=TOL)
    for kw in (dict(top_p=0.75), dict(min_p=0.3), dict(top_k=3, top_p=0.8, min_p=0.3)):
        logp, ent = naive_logprobs_entropy(logits, targets, **kw)
        lp3 = [math.log(4 / 9), math.log(3 / 9), math.log(2 / 9)]
        np.testing.assert_allclose(logp[0], lp3 + [LOGP_OUTSIDE_KEPT], atol=TOL)
        np.testing.assert_allclose(ent[0], [-sum(math.exp(v) * v for v in lp3)] * 4, atol=TOL)
    # exactly k under ties: the lower token id wins
    tied = jnp.zeros((1, 1, 4), jnp.float32)
    logp, _ = naive_logprobs_entropy(tied, jnp.array([[1]]), top_k=2)
    np.testing.assert_allclose(logp, [[math.log(0.5)]], atol=TOL)
    logp, _ = naive_logprobs_entropy(tied, jnp.array([[2]]), top_k=2)
    np.testing.assert_allclose(logp, [[LOGP_OUTSIDE_KEPT]])


def numpy_filtered_reference(logits, targets, temperature, top_k, top_p, min_p):
    """float64 filtered log-softmax and entropy, written independently (per row loops)."""
    z_all = np.asarray(logits, np.float64) / temperature
    logp = np.zeros(z_all.shape[:-1])
    ent = np.zeros(z_all.shape[:-1])
    keep_all = np.zeros(z_all.shape, bool)
    for idx in np.ndindex(z_all.shape[:-1]):
        z = z_all[idx]
        order = np.argsort(-z, kind="stable")
        kept = order[:top_k] if top_k > 0 else order
        p = np.exp(z[kept] - z[kept].max())
        p /= p.sum()
        keep = np.zeros(z.shape, bool)
        mass = 0.0
        for tok, prob in zip(kept, p):
            keep[tok] = mass < top_p or top_p >= 1
            mass += prob
        keep &= z >= z.max() + (np.log(min_p) if min_p > 0 else -np.inf)
        zk = np.where(keep, z, -np.inf)
        logq = zk - zk.max() - np.log(np.exp(zk - zk.max()).sum())
        y = int(np.asarray(targets)[idx])
        logp[idx] = logq[y] if keep[y] else LOGP_OUTSIDE_KEPT
        ent[idx] = -(np.exp(logq[keep]) * logq[keep]).sum()
        keep_all[idx] = keep
    return logp, ent, keep_all


FILTERS = [(5, 1.0, 0.0, 0.7), (-1, 0.9, 0.0, 0.7), (-1, 1.0, 0.1, 1.0), (4, 0.8, 0.05, 1.3)]


@pytest.mark.parametrize("top_k,top_p,min_p,temperature", FILTERS)
def test_filtered_chunked_matches_numpy_and_gradient_is_kept_softmax(data, top_k, top_p, min_p,
                                                                     temperature):
    hidden, w, _ = data
    logits = jnp.einsum("btd,dv->btv", hidden, w)
    kw = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    # targets: the mode at even positions (always kept), the least likely token at odd ones
    # (outside the kept set whenever the filter removes anything)
    order = np.argsort(-np.asarray(logits), axis=-1, kind="stable")
    targets = jnp.asarray(np.where(np.arange(T) % 2 == 0, order[..., 0], order[..., -1]))
    ref_logp, ref_ent, keep = numpy_filtered_reference(logits, targets, **kw)
    assert 0 < keep.sum() < keep.size  # the filter removes tokens
    for c in (3, 128):
        logp, ent = chunked_logprobs_entropy(hidden, targets, lambda h: h @ w, chunk_size=c, **kw)
        np.testing.assert_allclose(logp, ref_logp, rtol=TOL, atol=TOL)
        np.testing.assert_allclose(ent, ref_ent, rtol=TOL, atol=TOL)
    # d logp / d logits = (onehot(y) - mu) / temperature on the kept set, 0 elsewhere; and 0
    # everywhere for a target outside the kept set (its logp is a constant)
    grad = jax.grad(lambda x: jnp.sum(naive_logprobs_entropy(x, targets, **kw)[0]))(logits)
    t_np = np.asarray(targets)
    y_kept = np.take_along_axis(keep, t_np[..., None], -1)[..., 0]
    z = np.where(keep, np.asarray(logits, np.float64) / temperature, -np.inf)
    mu = np.exp(z - z.max(-1, keepdims=True))
    mu /= mu.sum(-1, keepdims=True)
    onehot = np.eye(V)[t_np]
    expected = np.where(y_kept[..., None], (onehot - mu) / temperature, 0.0)
    np.testing.assert_allclose(grad, expected, rtol=1e-4, atol=1e-5)
    assert np.all(np.asarray(grad)[~keep] == 0.0)
    # the chunked, rematerialised path has the same gradient in the unembedding
    adv = jnp.asarray(np.random.default_rng(0).normal(size=(B, T)), jnp.float32)
    g_chunked = jax.grad(lambda w_: jnp.sum(adv * chunked_logprobs_entropy(
        hidden, targets, lambda h: h @ w_, chunk_size=3, **kw)[0]))(w)
    g_naive = jax.grad(lambda w_: jnp.sum(adv * naive_logprobs_entropy(
        jnp.einsum("btd,dv->btv", hidden, w_), targets, **kw)[0]))(w)
    assert np.all(np.isfinite(np.asarray(g_chunked)))
    np.testing.assert_allclose(g_chunked, g_naive, rtol=1e-4, atol=1e-5)


def test_filter_off_is_the_unfiltered_path(data):
    """-1 / 1 / 0 are exactly the unfiltered computation (same values bit for bit)."""
    hidden, w, targets = data
    a = chunked_logprobs_entropy(hidden, targets, lambda h: h @ w, temperature=0.7)
    b = chunked_logprobs_entropy(hidden, targets, lambda h: h @ w, temperature=0.7,
                                 top_k=-1, top_p=1.0, min_p=0.0)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    # a filter that keeps everything gives the same distribution
    c = chunked_logprobs_entropy(hidden, targets, lambda h: h @ w, temperature=0.7, top_k=V)
    np.testing.assert_allclose(c[0], a[0], atol=TOL)
    np.testing.assert_allclose(c[1], a[1], atol=TOL)


@pytest.mark.parametrize("kwargs, match", [
    (dict(top_k=0), "top_k"), (dict(top_k=-2), "top_k"), (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"), (dict(min_p=1.0), "min_p"), (dict(min_p=-0.1), "min_p"),
])
def test_bad_filter_values(data, kwargs, match):
    hidden, w, targets = data
    with pytest.raises(ValueError, match=match):
        chunked_logprobs_entropy(hidden, targets, lambda h: h @ w, **kwargs)
