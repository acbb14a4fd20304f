"""Tests for samplers.jax_sampler / jax_decode / jax_sampling on a tiny random Qwen2 model.

References: the learner's full-forward log-probs (`entr_jax.logprobs.token_logprobs_entropy`)
and float64 numpy re-implementations of the filters. Tolerance 1e-5 for f32 (design.md).
One sampler (and so one set of compiled functions) is shared by the module; its shapes stay
in the buckets (batch 8, prompt 8 or 16, new tokens 8; 16 in the KV-cache growth test) to
keep compilations few.
"""

import dataclasses
import functools
import re
import threading
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from entr_jax.interfaces import Sampler, SamplingParams
from entr_jax.logprobs import token_logprobs_entropy
from entr_jax.model import Decoder, ModelConfig
from samplers.jax_sampler import JaxSampler, JaxSamplerConfig
from samplers.jax_sampling import sample_tokens

TOL = 1e-5
V = 97
CFG = ModelConfig(architecture="qwen2", vocab_size=V, hidden_size=32, intermediate_size=48,
                  num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, attention_bias=True)
PROMPTS = [[5, 17, 3], [60, 2, 2, 9, 41], [88, 1, 7, 7, 30, 12, 4], [11, 50, 23, 96]]


def make_model(seed: int) -> Decoder:
    """Random Decoder whose unembedding is scaled up so distributions are peaked (logit std
    ~4), which makes top-p / min-p / stop tokens bite."""
    model = Decoder(CFG, rngs=nnx.Rngs(seed))
    model.lm_head.value = model.lm_head.value * 40.0
    return model


@pytest.fixture(scope="module")
def models():
    return make_model(0), make_model(1), make_model(2)


@pytest.fixture(scope="module")
def sampler(models):
    cfg = JaxSamplerConfig(max_batch_size=8, min_prompt_bucket=8, steps_per_call=3)
    return JaxSampler(models[0], version=0, config=cfg)


L_PAD, ROWS = 24, 8  # learner batches: every prompt + response fits in 24 tokens


@nnx.jit
def _learner_forward(model, tokens, mask):
    logp, ent = token_logprobs_entropy(model, tokens, mask)
    return logp, ent, model(tokens, mask)


def learner_view(model, gens):
    """The learner's view of every response token, from one padded, jitted full forward per
    8 generations: per generation ``(logp [R], entropy [R], logits [R, V] float64)``."""
    out = []
    for start in range(0, len(gens), ROWS):
        chunk = gens[start:start + ROWS]
        tokens = np.zeros((ROWS, L_PAD), np.int32)
        mask = np.zeros((ROWS, L_PAD), bool)
        for r, g in enumerate(chunk):
            seq = np.concatenate([g.prompt_ids, g.response_ids])
            tokens[r, :len(seq)], mask[r, :len(seq)] = seq, True
        logp, ent, logits = jax.device_get(_learner_forward(model, tokens, mask))
        for r, g in enumerate(chunk):
            s, n = len(g.prompt_ids) - 1, len(g.response_ids)
            out.append((logp[r, s:s + n], ent[r, s:s + n],
                        logits[r, s:s + n].astype(np.float64)))
    return out


def flat(out):
    return [g for row in out for g in row]


def test_implements_protocol(sampler):
    assert isinstance(sampler, Sampler)


def test_logp_entropy_match_learner_unfiltered(sampler, models):
    params = SamplingParams(max_new_tokens=8, seed=3)
    out = sampler.generate(PROMPTS, params, num_samples=2)
    assert [len(row) for row in out] == [2] * len(PROMPTS)
    views = iter(learner_view(models[0], flat(out)))
    for i, row in enumerate(out):
        for g in row:
            np.testing.assert_array_equal(g.prompt_ids, PROMPTS[i])
            assert len(g.response_ids) == 8 and g.finish_reason == "length"
            logp, ent, _ = next(views)
            np.testing.assert_allclose(g.logp_mu, logp, atol=TOL, rtol=TOL)
            np.testing.assert_allclose(g.entropy_mu, ent, atol=TOL, rtol=TOL)
            np.testing.assert_array_equal(g.token_version, np.zeros(8, np.int32))
    assert sampler.last_stats["tokens_generated"] == 64
    assert sampler.last_stats["prefills"] == 1 and sampler.last_stats["decode_steps"] == 7


def reference_filter(z, top_k, top_p, min_p):
    """float64 keep-mask over one row of tempered logits: top-k, then top-p on the
    renormalised top-k distribution, then min-p (written independently)."""
    order = np.argsort(-z, kind="stable")
    keep = np.zeros(z.shape, bool)
    kept = order[:top_k] if top_k > 0 else order
    p = np.exp(z[kept] - z[kept].max())
    p /= p.sum()
    mass = 0.0
    for tok, prob in zip(kept, p):  # decreasing order
        if mass < top_p or top_p >= 1:
            keep[tok] = True
        mass += prob
    keep &= z >= z.max() + (np.log(min_p) if min_p > 0 else -np.inf)
    return keep


@pytest.mark.parametrize("top_k,top_p,min_p,temperature", [
    (5, 1.0, 0.0, 0.7),
    (20, 0.8, 0.0, 1.3),
    (-1, 0.9, 0.05, 1.0),
])
def test_filtered_logp_is_renormalised_filtered_distribution(sampler, models, top_k, top_p,
                                                              min_p, temperature):
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                            max_new_tokens=6, seed=11)
    nontrivial = 0
    gens = flat(sampler.generate(PROMPTS, params, num_samples=2))
    for g, (_, _, logits_RV) in zip(gens, learner_view(models[0], gens)):
        for t, logits in enumerate(logits_RV):
            z = logits / temperature
            keep = reference_filter(z, top_k, top_p, min_p)
            assert keep[g.response_ids[t]], "sampled a filtered-out token"
            zk = np.where(keep, z, -np.inf)
            logq = zk - zk.max() - np.log(np.exp(zk - zk.max()).sum())
            p = np.exp(logq)
            ent = -(p[keep] * logq[keep]).sum()
            np.testing.assert_allclose(g.logp_mu[t], logq[g.response_ids[t]], atol=TOL, rtol=TOL)
            np.testing.assert_allclose(g.entropy_mu[t], ent, atol=TOL, rtol=TOL)
            nontrivial += 0 < keep.sum() < V
    assert nontrivial > 0  # the filter really removed tokens


def test_sample_tokens_frequencies_and_noop_filter():
    """Draws follow the filtered distribution; a filter that keeps everything draws the
    same tokens as no filter (the same uniform inverts the same distribution)."""
    logits = jnp.asarray([[2.0, 1.0, 0.0, -1.0, 0.5]], jnp.float32)
    n = 4000
    keys = jax.random.split(jax.random.key(0), n)
    big = jnp.broadcast_to(logits, (n, 5))
    sample = jax.jit(sample_tokens, static_argnames="filtered")
    tok, logp, _ = sample(big, keys, 1.0, 3, 1.0, 0.0, filtered=True)
    top3 = [0, 1, 4]  # logits 2.0, 1.0, 0.5
    z = np.asarray(logits[0], np.float64)
    p = np.zeros(5)
    p[top3] = np.exp(z[top3]) / np.exp(z[top3]).sum()  # 0.629, 0.231, 0.140
    freq = np.bincount(np.asarray(tok), minlength=5) / n
    np.testing.assert_allclose(freq, p, atol=0.03)  # ~4 sigma at n = 4000; 0 off the top 3
    np.testing.assert_allclose(np.exp(np.asarray(logp)), p[np.asarray(tok)], rtol=1e-5)
    t_all, lp_all, e_all = sample(big, keys, 1.0, 5, 1.0, 0.0, filtered=True)
    t_none, lp_none, e_none = sample(big, keys, 1.0, -1, 1.0, 0.0, filtered=False)
    np.testing.assert_array_equal(t_all, t_none)
    np.testing.assert_allclose(lp_all, lp_none, atol=TOL)
    np.testing.assert_allclose(e_all, e_none, atol=TOL)


def test_seeded_determinism_and_batching_independence(sampler):
    params = SamplingParams(max_new_tokens=8, seed=5)
    a = sampler.generate(PROMPTS, params, num_samples=2)
    b = sampler.generate(PROMPTS, params, num_samples=2)
    c = sampler.generate(PROMPTS, SamplingParams(max_new_tokens=8, seed=6), num_samples=2)
    for ga, gb in zip(flat(a), flat(b)):
        np.testing.assert_array_equal(ga.response_ids, gb.response_ids)
        np.testing.assert_array_equal(ga.logp_mu, gb.logp_mu)
    assert any(not np.array_equal(ga.response_ids, gc.response_ids)
               for ga, gc in zip(flat(a), flat(c)))
    # Samples of one prompt differ from each other (keys depend on the sample index).
    assert not np.array_equal(a[0][0].response_ids, a[0][1].response_ids)
    # Prompts 0-2 again, now batched with a 12-token prompt: different batch composition and
    # prompt bucket (16 instead of 8), same prompt indices => same tokens.
    d = sampler.generate(PROMPTS[:3] + [list(range(40, 52))], params, num_samples=2)
    for i in range(3):
        for ga, gd in zip(a[i], d[i]):
            np.testing.assert_array_equal(ga.response_ids, gd.response_ids)
            np.testing.assert_allclose(ga.logp_mu, gd.logp_mu, atol=TOL)
            np.testing.assert_allclose(ga.entropy_mu, gd.entropy_mu, atol=TOL)


def test_no_recompilation_after_warmup(sampler):
    rng = np.random.default_rng(0)
    warm = [[1] * 3, [2] * 14]  # prompt buckets 8 and 16
    for prompts in ([warm[0]], [warm[1]]):
        sampler.generate(prompts * 8, SamplingParams(max_new_tokens=8), num_samples=1)
    before = sampler.num_traces
    assert before["prefill"] >= 1 and before["decode_chunk"] >= 1
    for n in range(20):
        num = int(rng.integers(5, 9))
        prompts = [list(rng.integers(0, V, size=int(rng.integers(1, 17)))) for _ in range(num)]
        params = SamplingParams(temperature=float(rng.uniform(0.5, 1.5)), seed=n,
                                max_new_tokens=int(rng.integers(5, 9)),
                                stop_token_ids=tuple(int(x) for x in rng.integers(0, V, 3)))
        out = sampler.generate(prompts, params)
        assert len(out) == num
    assert sampler.num_traces == before


def test_stop_tokens_and_length(sampler):
    """A stop set does not change the draws, only where a row ends: the golden responses
    are the stop-free ones cut after the first stop token."""
    free = flat(sampler.generate(PROMPTS, SamplingParams(max_new_tokens=5, seed=1), 2))
    stop_tok = int(free[0].response_ids[2])
    params = SamplingParams(max_new_tokens=5, stop_token_ids=(stop_tok, V - 1), seed=1)
    gens = flat(sampler.generate(PROMPTS, params, num_samples=2))
    reasons = []
    for f, g in zip(free, gens):
        hits = np.flatnonzero(np.isin(f.response_ids, params.stop_token_ids))
        n = hits[0] + 1 if hits.size else 5
        np.testing.assert_array_equal(g.response_ids, f.response_ids[:n])
        np.testing.assert_array_equal(g.logp_mu, f.logp_mu[:n])
        reasons.append(g.finish_reason)
        assert g.finish_reason == ("stop" if hits.size else "length")
    assert set(reasons) == {"stop", "length"}
    assert sampler.last_stats["tokens_generated"] == sum(len(g.response_ids) for g in gens)
    # Every row stops at its first token: the decode loop never runs.
    first = tuple(sorted({int(f.response_ids[0]) for f in free}))
    gens = flat(sampler.generate(PROMPTS, SamplingParams(max_new_tokens=5, stop_token_ids=first,
                                                         seed=1), 2))
    assert all(len(g.response_ids) == 1 and g.finish_reason == "stop" for g in gens)
    assert sampler.last_stats["decode_steps"] == 0


def check_versions(gens, models_by_version, expected_versions):
    """Every generation's versions equal ``expected_versions`` and each token's logp_mu /
    entropy_mu equal the learner's under the weights of its version."""
    for version, model in models_by_version.items():
        for g, (logp, ent, _) in zip(gens, learner_view(model, gens)):
            np.testing.assert_array_equal(g.token_version, expected_versions)
            sel = g.token_version == version
            assert sel.any()
            np.testing.assert_allclose(g.logp_mu[sel], logp[sel], atol=TOL, rtol=TOL)
            np.testing.assert_allclose(g.entropy_mu[sel], ent[sel], atol=TOL, rtol=TOL)


def test_inflight_weight_schedule(sampler, models):
    m0, m1, m2 = models
    schedule = [(2, nnx.state(m1), 1), (5, m2, 2)]
    params = SamplingParams(max_new_tokens=8, seed=2)
    out = sampler.generate(PROMPTS, params, num_samples=2, weight_schedule=schedule)
    expected = np.array([0, 0, 1, 1, 1, 2, 2, 2], np.int32)
    check_versions(flat(out), {0: m0, 1: m1, 2: m2}, expected)
    assert sampler.last_stats["weight_swaps"] == 2
    assert sampler.version == 0  # the schedule does not install weights


def test_swap_recomputes_only_the_written_cache_slots_with_the_same_result(sampler, models,
                                                                          monkeypatch):
    """After a swap the KV cache is rebuilt over the slots written so far (rounded up to
    `samplers.jax_batches.RECOMPUTE_GRAIN`), not all M: at grain 4 the swap at step 2 rebuilds 12 of 16 slots,
    and every token, log-prob and entropy is the full rebuild's (the same tokens; log-probs
    within TOL: other matmul shapes round differently, 1.1e-6 here) and its version's
    learner conditional."""
    from samplers import jax_batches as jb

    m0, m1, m2 = models
    schedule = [(2, nnx.state(m1), 1), (5, m2, 2)]
    params = SamplingParams(max_new_tokens=8, seed=2)
    full = flat(sampler.generate(PROMPTS, params, num_samples=2, weight_schedule=schedule))
    monkeypatch.setattr(jb, "RECOMPUTE_GRAIN", 4)
    seen = []
    original = sampler.programs.recompute
    monkeypatch.setattr(sampler, "programs", dataclasses.replace(
        sampler.programs,
        recompute=lambda *a, length: seen.append(length) or original(*a, length=length)))
    part = flat(sampler.generate(PROMPTS, params, num_samples=2, weight_schedule=schedule))
    assert seen == [12, 16]  # prompt bucket 8 + step 2 -> 12; 8 + 5 -> 16 = M
    for a, b in zip(full, part):
        np.testing.assert_array_equal(a.response_ids, b.response_ids)
        np.testing.assert_allclose(a.logp_mu, b.logp_mu, atol=TOL, rtol=0)
        np.testing.assert_allclose(a.entropy_mu, b.entropy_mu, atol=TOL, rtol=0)
    check_versions(part, {0: m0, 1: m1, 2: m2}, np.array([0, 0, 1, 1, 1, 2, 2, 2], np.int32))


def test_kv_cache_grows_with_the_response_and_changes_no_token(sampler, models, monkeypatch):
    """The KV cache holds only the slots the next chunk can write (`samplers.jax_batches.cache_slots`: the
    prompt bucket doubled, at most M) and grows between chunks: with prompt bucket 8, 16
    new tokens (M = 24) and 3 steps per chunk, prefill allocates 16 slots and the chunk
    ending at step 10 grows them to 24 (8 + 10 > 16). An 8-token prompt fills its bucket,
    so its chunk 7 -> 10 writes position 16: growing a chunk late would drop that K/V and
    change its later tokens. The tokens are those of a cache of all M slots from the start,
    and every log-prob and entropy the learner's; a swap at step 5 rebuilds the cache while
    it holds 16 of the 24 slots, and each token is its version's conditional."""
    from samplers import jax_batches as jb

    assert [jb.cache_slots(8, 16, e) for e in (1, 4, 8, 9, 16)] == [16, 16, 16, 24, 24]
    assert [jb.cache_slots(32, 512, e) for e in (32, 33, 96, 97, 480, 512)] == [
        64, 128, 128, 256, 512, 544]
    prompts = PROMPTS + [[3, 14, 15, 92, 65, 35, 89, 79]]  # 8 tokens: a full bucket
    params = SamplingParams(max_new_tokens=16, seed=6)
    seen, rebuilt = [], []
    grow, recompute = sampler.programs.grow, sampler.programs.recompute
    monkeypatch.setattr(sampler, "programs", dataclasses.replace(
        sampler.programs, grow=lambda state, length: seen.append((state.cache.max_len, length))
        or grow(state, length=length)))
    grown = flat(sampler.generate(prompts, params))
    assert seen == [(16, 24)]
    m0, m1, _ = models
    monkeypatch.setattr(sampler, "programs", dataclasses.replace(
        sampler.programs,
        recompute=lambda w, state, *a, length: rebuilt.append((state.cache.max_len, length))
        or recompute(w, state, *a, length=length)))
    swapped = flat(sampler.generate(prompts, params,
                                    weight_schedule=[(5, m1, 1)]))
    assert rebuilt == [(16, 16)] and seen == [(16, 24)] * 2
    check_versions(swapped, {0: m0, 1: m1}, np.array([0] * 5 + [1] * 11, np.int32))
    monkeypatch.setattr(jb, "cache_slots", lambda p_bucket, new_bucket, end: p_bucket + new_bucket)
    full = flat(sampler.generate(prompts, params))
    assert seen == [(16, 24)] * 2  # no growth when all M slots are allocated at prefill
    for a, b, (logp, ent, _) in zip(grown, full, learner_view(m0, grown)):
        np.testing.assert_array_equal(a.response_ids, b.response_ids)
        np.testing.assert_allclose(a.logp_mu, logp, atol=TOL, rtol=TOL)
        np.testing.assert_allclose(a.entropy_mu, ent, atol=TOL, rtol=TOL)


def test_update_weights_from_another_thread_while_paused(sampler, models):
    """Async path: the weights are snapshotted, the sampler is held by `pause`, another
    version is installed, and from the next boundary on tokens carry the new version."""
    m0, m1, _ = models
    params = SamplingParams(max_new_tokens=8, seed=4)
    result = {}
    sampler.pause()
    worker = threading.Thread(target=lambda: result.update(out=sampler.generate(PROMPTS, params, 2)))
    worker.start()
    try:
        assert sampler.wait_until_held(timeout=120), "generate did not reach the pause"
        assert worker.is_alive() and sampler.last_stats["prefills"] == 0
        sampler.update_weights(nnx.state(m1), version=7)
    finally:
        sampler.resume()
        worker.join(timeout=120)
        sampler.update_weights(m0, version=0)
    expected = np.array([0] + [7] * 7, np.int32)
    check_versions(flat(result["out"]), {0: m0, 7: m1}, expected)


def test_bad_input_errors(sampler):
    with pytest.raises(ValueError, match="prompts\\[1\\]"):
        sampler.generate([[1], []], SamplingParams())
    with pytest.raises(ValueError, match="outside"):
        sampler.generate([[V]], SamplingParams())
    with pytest.raises(ValueError, match="num_samples"):
        sampler.generate([[1]], SamplingParams(), num_samples=0)
    with pytest.raises(ValueError, match="stop_token_ids"):
        sampler.generate([[1]], SamplingParams(stop_token_ids=(V,)))
    with pytest.raises(ValueError, match="weight_schedule\\[1\\]"):
        sampler.generate([[1]], SamplingParams(), weight_schedule=[(3, nnx.state(make_model(0)), 1),
                                                                   (3, nnx.state(make_model(0)), 2)])
    wider = Decoder(dataclasses.replace(CFG, intermediate_size=40), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="shape"):
        sampler.update_weights(wider, version=1)
    with pytest.raises(TypeError, match="nnx.State"):
        sampler.update_weights({"w": np.zeros(3)}, version=1)
    assert sampler.version == 0
    with pytest.raises(ValueError, match="max_batch_size"):
        JaxSamplerConfig(max_batch_size=0)
    with pytest.raises(ValueError, match="dtype"):
        JaxSamplerConfig(dtype="float16")


@pytest.mark.slow
def test_stale_cache_swap_and_bf16_mismatch(models):
    """Two extra samplers (own compilations, hence slow): without KV recomputation the
    tokens after a swap come from new weights over a stale cache (they are not the new
    model's conditionals); bf16 sampling deviates from the f32 learner, boundedly."""
    m0, m1, _ = models
    cfg = JaxSamplerConfig(max_batch_size=8, min_prompt_bucket=8, recompute_kv_on_swap=False)
    stale = JaxSampler(m0, config=cfg)
    params = SamplingParams(max_new_tokens=8, seed=2)
    gens = flat(stale.generate(PROMPTS, params, 2, weight_schedule=[(3, m1, 1)]))
    expected = np.array([0, 0, 0, 1, 1, 1, 1, 1], np.int32)
    gap = 0.0
    for g, (logp0, _, _), (logp1, _, _) in zip(gens, learner_view(m0, gens), learner_view(m1, gens)):
        np.testing.assert_array_equal(g.token_version, expected)
        np.testing.assert_allclose(g.logp_mu[:3], logp0[:3], atol=TOL, rtol=TOL)
        gap = max(gap, float(np.abs(g.logp_mu[3:] - logp1[3:]).max()))
    assert gap > 1e-3

    bf16 = JaxSampler(m0, config=JaxSamplerConfig(max_batch_size=8, min_prompt_bucket=8,
                                                  dtype="bfloat16"))
    gens = flat(bf16.generate(PROMPTS, params, 2))
    diff = np.concatenate([g.logp_mu - lp for g, (lp, _, _) in zip(gens, learner_view(m0, gens))])
    assert 1e-5 < np.abs(diff).max() < 0.5


# ---- the learner scores the distribution the sampler drew from (issue 11, item 2)

_FILTER_ARGS = ("temperature", "top_k", "top_p", "min_p")


@functools.partial(nnx.jit, static_argnames=_FILTER_ARGS)
def _learner_logprobs(model, tokens, mask, *, temperature, top_k, top_p, min_p):
    return token_logprobs_entropy(model, tokens, mask, temperature=temperature, top_k=top_k,
                                  top_p=top_p, min_p=min_p)


def _trajectory_arrays(gens, logprob_fn):
    """``[R]`` arrays of every response token: (logp_pi, entropy_pi, logp_mu, entropy_mu)."""
    out = []
    for start in range(0, len(gens), ROWS):
        chunk = gens[start:start + ROWS]
        tokens = np.zeros((ROWS, L_PAD), np.int32)
        mask = np.zeros((ROWS, L_PAD), bool)
        for r, g in enumerate(chunk):
            seq = np.concatenate([g.prompt_ids, g.response_ids])
            tokens[r, :len(seq)], mask[r, :len(seq)] = seq, True
        logp, ent = jax.device_get(logprob_fn(tokens, mask))
        for r, g in enumerate(chunk):
            s, n = len(g.prompt_ids) - 1, len(g.response_ids)
            out.append((logp[r, s:s + n], ent[r, s:s + n], g.logp_mu, g.entropy_mu))
    return [np.concatenate(a) for a in zip(*out)]


def _assert_on_policy(logp_pi, entropy_pi, logp_mu, entropy_mu):
    """Ratio 1 and equal entropies within 1e-5 on every token; ENTR masks none of them."""
    from entr_jax.objectives import make_objective

    assert np.abs(logp_pi - logp_mu).max() <= TOL
    np.testing.assert_allclose(entropy_pi, entropy_mu, atol=TOL, rtol=TOL)
    batch = types.SimpleNamespace(
        logp_mu=jnp.asarray(logp_mu)[None], entropy_mu=jnp.asarray(entropy_mu)[None],
        advantages=jnp.ones((1, len(logp_mu)), jnp.float32),
        loss_mask=jnp.ones((1, len(logp_mu)), bool))
    _, metrics = make_objective("entr")(jnp.asarray(logp_pi)[None], batch)
    assert float(metrics["mask/fraction"]) == 0.0
    np.testing.assert_allclose(float(metrics["ratio_pi_mu/max"]), 1.0, atol=2 * TOL)


@pytest.mark.parametrize("top_k,top_p,min_p,temperature", [
    (-1, 0.9, 0.0, 0.7),   # before the fix: max |logp_pi - logp_mu| ~ 0.1 on this model
    (5, 1.0, 0.0, 1.0),
    (-1, 1.0, 0.1, 1.0),   # before: ENTR masked part of these on-policy tokens
])
def test_learner_logprobs_score_the_filtered_distribution(sampler, models, top_k, top_p, min_p,
                                                          temperature):
    """Same weights: `token_logprobs_entropy` with the sampler's filters (what the learner
    runs) gives logp_pi == logp_mu and entropy_pi == entropy_mu within 1e-5 on every token."""
    kw = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    gens = flat(sampler.generate(PROMPTS, SamplingParams(max_new_tokens=8, seed=7, **kw),
                                 num_samples=2))
    arrays = _trajectory_arrays(gens, lambda t, m: _learner_logprobs(models[0], t, m, **kw))
    _assert_on_policy(*arrays)
    # the unfiltered score is off by a lot (what the learner did before), so the check bites
    unfiltered = _trajectory_arrays(
        gens, lambda t, m: _learner_logprobs(models[0], t, m, temperature=temperature,
                                             top_k=-1, top_p=1.0, min_p=0.0))
    assert np.abs(unfiltered[0] - arrays[2]).max() > 0.05


def test_learner_config_filters_reach_the_logprob_function(sampler, models):
    """End to end through `LearnerConfig` -> `Learner.token_logprobs` (the learner's
    compiled log-prob function, `make_logprob_fn`) with every filter at once."""
    from entr_jax.types import Trajectory
    from learners.learner import Learner, LearnerConfig

    kw = dict(temperature=0.7, top_k=20, top_p=0.9, min_p=0.05)
    gens = flat(sampler.generate(PROMPTS, SamplingParams(max_new_tokens=8, seed=9, **kw),
                                 num_samples=2))
    learner = Learner(lambda: make_model(0), LearnerConfig(min_length=L_PAD, **kw),
                      devices=jax.devices()[:1])
    learner.load_params(nnx.state(models[0], nnx.Param))
    arrays = learner.token_logprobs([Trajectory.from_generation(g) for g in gens])
    mask = arrays["loss_mask"]
    assert mask.sum() == sum(len(g.response_ids) for g in gens)
    _assert_on_policy(*(arrays[k][mask] for k in ("logp_pi", "entropy_pi", "logp_mu",
                                                  "entropy_mu")))


def test_a_learner_without_the_samplers_filters_refuses_their_trajectories(sampler, models):
    """Trajectories drawn with top-k / min-p, given to a learner built without them (which
    would score the unfiltered softmax: |logp_pi - logp_mu| far above rounding, silently),
    are refused naming both settings; with the sampler's settings they score on-policy."""
    from entr_jax.objectives import make_objective
    from entr_jax.types import BehaviorParams, Trajectory
    from learners.learner import Learner, LearnerConfig

    kw = dict(temperature=1.0, top_k=5, top_p=1.0, min_p=0.1)
    gens = flat(sampler.generate(PROMPTS, SamplingParams(max_new_tokens=8, seed=9, **kw),
                                 num_samples=2))
    trajs = [Trajectory.from_generation(g, behavior=BehaviorParams(**kw)) for g in gens]
    unfiltered = Learner(lambda: make_model(0), LearnerConfig(min_length=L_PAD),
                         objective=make_objective("entr"), devices=jax.devices()[:1])
    message = ("trajectories[0] was sampled with temperature=1.0, top_k=5, top_p=1.0, "
               "min_p=0.1, but the learner scores temperature=1.0, top_k=-1, top_p=1.0, "
               "min_p=0.0: logp_pi would not be the distribution logp_mu describes")
    for call in (unfiltered.token_logprobs, lambda t: unfiltered.train_on(t, [0.0] * len(t))):
        with pytest.raises(ValueError, match=re.escape(message)):
            call(trajs)
    matched = Learner(lambda: make_model(0), LearnerConfig(min_length=L_PAD, **kw),
                      devices=jax.devices()[:1])
    matched.load_params(nnx.state(models[0], nnx.Param))
    arrays = matched.token_logprobs(trajs)
    mask = arrays["loss_mask"]
    assert np.abs(arrays["logp_pi"][mask] - arrays["logp_mu"][mask]).max() <= TOL


def test_draw_inverts_the_cdf_at_the_keys_uniform_and_skips_probability_zero():
    """`draw` returns the first y with F(y) > u F(V-1), F the running sum of the weights,
    u = uniform(key): checked against that rule in float64 on hand-made distributions,
    including zero-probability entries at the start, inside and at the end."""
    from samplers.jax_sampling import draw

    inf = np.inf
    with np.errstate(divide="ignore"):  # log 0 = -inf is the point of these rows
        rows = np.log(np.array([
            [0.5, 0.25, 0.0, 0.125, 0.125],   # a zero inside
            [0.0, 0.0, 1.0, 0.0, 0.0],        # one token: always drawn
            [0.0, 0.3, 0.3, 0.4, 0.0],        # zeros at both ends
            [0.2, 0.2, 0.2, 0.2, 0.2],
        ], np.float64)).astype(np.float32)
    keys = jax.random.split(jax.random.key(3), 256)
    for z in rows:
        tokens = np.asarray(jax.jit(draw)(jnp.broadcast_to(jnp.asarray(z), (256, 5)), keys))
        w = np.exp(z.astype(np.float64) - z.max())
        cdf = np.cumsum(w)
        for key, y in zip(keys, tokens):
            u = float(jax.random.uniform(key, (), jnp.float32))
            expected = int(np.argmax((cdf > u * cdf[-1]) & (w > 0)))
            assert y == expected
        assert np.all(w[tokens] > 0)
    assert np.all(np.asarray(draw(jnp.asarray([[0.0, -inf, -inf]] * 64), keys[:64])) == 0)
    assert np.all(np.asarray(draw(jnp.asarray([[-inf, -inf, 5.0]] * 64), keys[:64])) == 2)


def test_draw_searches_blocks_with_the_same_rule_over_a_vocabulary_of_many_blocks():
    """The two-level search of `draw` (block sums, then a running sum inside one block)
    gives the token of the one-level rule (first y with F(y) > u F(V-1) and w(y) > 0,
    here in float64) on a vocabulary of 10 blocks whose last is partial, with whole blocks
    of probability 0, zeros on block edges and one dominant token; and never a token of
    probability 0."""
    from samplers.jax_sampling import block_size, draw

    v = 300
    c = block_size(v)
    assert (c, -(-v // c)) == (32, 10)
    rng = np.random.default_rng(0)
    w = rng.random((4, v)) ** 4
    w[0, c:3 * c] = 0.0             # two whole blocks of probability 0
    w[1, c - 1::c] = 0.0            # the last entry of every block
    w[1, 0::c] = 0.0                # and the first
    w[2, :] = 0.0
    w[2, [5, 150, 299]] = [0.2, 0.5, 0.3]  # three tokens, one in the partial last block
    w[3, 77] = 1e4                  # one dominant token
    keys = jax.random.split(jax.random.key(11), 512)
    for row in w:
        z = np.where(row > 0, np.log(np.maximum(row, 1e-300)), -np.inf).astype(np.float32)
        tokens = np.asarray(jax.jit(draw)(jnp.broadcast_to(jnp.asarray(z), (512, v)), keys))
        w64 = np.exp(z.astype(np.float64) - z.max())
        cdf = np.cumsum(w64)
        u = np.asarray(jax.vmap(lambda k: jax.random.uniform(k, (), jnp.float32))(keys),
                       np.float64)
        expected = np.argmax((cdf[None, :] > (u * cdf[-1])[:, None]) & (w64 > 0)[None, :], axis=1)
        np.testing.assert_array_equal(tokens, expected)
        assert np.all(w64[tokens] > 0)
    nan_row = jnp.full((4, v), jnp.nan, jnp.float32)  # no positive weight: an id in range
    np.testing.assert_array_equal(np.asarray(draw(nan_row, keys[:4])), [v - 1] * 4)


def test_device_batches_spread_rows_over_the_replicas():
    from samplers.jax_batches import device_batches

    def sizes(r, m, d):
        got = device_batches(r, m, d)
        assert [x for b in got for x in b] == list(range(r))  # consecutive, all, once
        return [len(b) for b in got]

    assert sizes(10, 4, 1) == [4, 4, 2]
    assert sizes(10, 4, 2) == [3, 3, 2, 2]
    assert sizes(32, 32, 2) == [16, 16]
    assert sizes(8, 8, 2) == [4, 4]
    assert sizes(3, 8, 2) == [2, 1]
    assert sizes(1, 8, 2) == [1]  # the second batch would be empty
    assert sizes(12, 4, 2) == [3, 3, 3, 3]
    assert sizes(9, 2, 3) == [2, 2, 2, 1, 1, 1]  # 5 batches needed -> 6
    assert sizes(0, 4, 2) == [] and sizes(0, 4, 1) == []


@pytest.fixture(scope="module")
def replicated(models):
    """The `sampler` fixture's settings on 2 devices, with at most 4 rows per device batch
    (the 12 requests of 4 prompts x 3 samples: 4 batches of 3 rows, 2 waves of 2)."""
    cfg = JaxSamplerConfig(max_batch_size=4, min_prompt_bucket=8, steps_per_call=3,
                           num_devices=2)
    return JaxSampler(models[0], version=0, config=cfg)


def test_replicas_sample_the_tokens_of_one_device(sampler, replicated, models, monkeypatch):
    """Spreading the batch over replicas changes no draw: same tokens, versions and finish
    reasons as the single-device sampler, with a weight schedule and stop tokens; the
    log-probs agree to float rounding (other batch shapes)."""
    from samplers import jax_batches as jb

    _, m1, m2 = models
    free = flat(sampler.generate(PROMPTS, SamplingParams(max_new_tokens=8, seed=3), 3))
    params = SamplingParams(max_new_tokens=8, seed=3,
                            stop_token_ids=(int(free[0].response_ids[3]),))
    schedule = [(2, nnx.state(m1), 1), (5, m2, 2)]
    one = flat(sampler.generate(PROMPTS, params, 3, weight_schedule=schedule))
    devices = []
    real = jb.BatchRun.generations
    monkeypatch.setattr(jb.BatchRun, "generations", lambda self, p, vocab, stats: (
        devices.append(self.state.tokens.devices()), real(self, p, vocab, stats))[1])
    # every input of a replica is put on its device explicitly: no implicit copy between
    # devices (one would queue behind the other replica's work)
    with jax.transfer_guard_device_to_device("disallow"):
        two = flat(replicated.generate(PROMPTS, params, 3, weight_schedule=schedule))
    assert {"stop", "length"} == {g.finish_reason for g in one}
    for a, b in zip(one, two):
        np.testing.assert_array_equal(a.response_ids, b.response_ids)
        np.testing.assert_array_equal(a.token_version, b.token_version)
        assert a.finish_reason == b.finish_reason
        np.testing.assert_allclose(a.logp_mu, b.logp_mu, atol=TOL)
        np.testing.assert_allclose(a.entropy_mu, b.entropy_mu, atol=TOL)
    assert devices == [{jax.local_devices()[0]}, {jax.local_devices()[1]}] * 2
    # The counters sum the 4 batches: requests sorted by prompt length, cut by
    # device_batches; a batch decodes until its longest row (token 0 is the prefill's)
    # and swaps at steps 2 and 5 if it is still running there.
    order = sorted(range(12), key=lambda r: len(PROMPTS[r // 3]))
    longest = [max(len(one[order[r]].response_ids) for r in rows)
               for rows in jb.device_batches(12, 4, 2)]
    st = replicated.last_stats
    assert st["prefills"] == 4
    assert st["decode_steps"] == sum(n - 1 for n in longest)
    assert st["weight_swaps"] == sum((n > 2) + (n > 5) for n in longest)
    assert st["tokens_generated"] == sum(len(g.response_ids) for g in one)
    assert replicated.version == 0
    assert replicated.generate([], params) == []


def test_replicas_take_weights_installed_while_paused(replicated, models):
    """Async path with replicas: weights installed while `generate` is held reach every
    replica at the same boundary."""
    m0, m1, _ = models
    params = SamplingParams(max_new_tokens=8, seed=4)
    result = {}
    replicated.pause()
    worker = threading.Thread(
        target=lambda: result.update(out=replicated.generate(PROMPTS[:2], params, 2)))
    worker.start()
    try:
        assert replicated.wait_until_held(timeout=120), "generate did not reach the pause"
        replicated.update_weights(nnx.state(m1), version=7)
    finally:
        replicated.resume()
        worker.join(timeout=120)
        replicated.update_weights(m0, version=0)
    assert replicated.last_stats["prefills"] == 2  # 4 requests: 2 batches, one wave
    check_versions(flat(result["out"]), {0: m0, 7: m1}, np.array([0] + [7] * 7, np.int32))


def test_replicas_need_the_devices(models):
    with pytest.raises(ValueError, match="num_devices"):
        JaxSamplerConfig(num_devices=0)
    n = len(jax.local_devices())
    with pytest.raises(ValueError, match=f"num_devices={n + 1} but this process has {n}"):
        JaxSampler(models[0], config=JaxSamplerConfig(num_devices=n + 1))
