"""The synthetic train/inference mismatch of the embedded sampler (samplers.jax_mismatch):
the recorded logp_mu / entropy_mu are those of the perturbed distribution that sampled
(1e-5), the noise is a function of (seed, prompt, sample, step) only, and 0 is off."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from entr_jax.interfaces import SamplingParams
from entr_jax.model import Decoder, ModelConfig
from samplers.jax_mismatch import NOISE_STREAM, perturb_logits
from samplers.jax_sampler import JaxSampler, JaxSamplerConfig

TOL = 1e-5
V = 97
CFG = ModelConfig(architecture="qwen2", vocab_size=V, hidden_size=32, intermediate_size=48,
                  num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, attention_bias=True)
PROMPTS = [[5, 17, 3], [60, 2, 2, 9, 41], [88, 1, 7, 7, 30, 12, 4], [11, 50, 23, 96]]
STD = 0.7
N_NEW = 6


@pytest.fixture(scope="module")
def model():
    m = Decoder(CFG, rngs=nnx.Rngs(0))
    m.lm_head.value = m.lm_head.value * 40.0  # peaked distributions (logit std ~4)
    return m


@pytest.fixture(scope="module")
def noisy(model):
    return JaxSampler(model, config=JaxSamplerConfig(max_batch_size=8, min_prompt_bucket=8,
                                                     logit_noise_std=STD))


@nnx.jit
def _logits(model, tokens):
    return model(tokens, tokens >= 0)


def token_key(seed, i, j, t):
    """The sampler's key of response token t of sample j of prompt i (jax_sampler docs)."""
    k = jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), i), j)
    return jax.random.fold_in(k, t)


def clean_logits(model, prompt, response):
    """f32 logits of the unperturbed model at every response position, ``[R, V]``."""
    seq = np.concatenate([prompt, response]).astype(np.int32)[None]
    logits = np.asarray(_logits(model, jnp.asarray(seq)))[0]
    s = len(prompt) - 1
    return logits[s:s + len(response)]


def test_logp_mu_and_entropy_mu_are_those_of_the_perturbed_distribution(noisy, model):
    seed, temperature = 4, 0.8
    out = noisy.generate(PROMPTS, SamplingParams(temperature=temperature, max_new_tokens=N_NEW,
                                                 seed=seed), num_samples=2)
    worst_clean = 0.0
    for i, row in enumerate(out):
        for j, g in enumerate(row):
            logits = clean_logits(model, g.prompt_ids, g.response_ids)
            for t, y in enumerate(g.response_ids):
                key = token_key(seed, i, j, t)
                noise = np.asarray(jax.random.normal(jax.random.fold_in(key, NOISE_STREAM), (V,)))
                z = (logits[t].astype(np.float64) + STD * noise) / temperature
                logq = z - z.max() - np.log(np.exp(z - z.max()).sum())
                np.testing.assert_allclose(g.logp_mu[t], logq[y], atol=TOL, rtol=TOL)
                np.testing.assert_allclose(g.entropy_mu[t], -(np.exp(logq) * logq).sum(),
                                           atol=TOL, rtol=TOL)
                # the drawn token inverts the perturbed distribution's CDF at the key's
                # uniform: F(y - 1) <= u < F(y) (float64 here, so a margin of rounding)
                u = float(jax.random.uniform(key, (), jnp.float32))
                cdf = np.cumsum(np.exp(logq))
                below = cdf[y - 1] if y > 0 else 0.0
                assert below - 1e-5 <= u < cdf[y] + 1e-5
                zc = logits[t].astype(np.float64) / temperature
                logc = zc - zc.max() - np.log(np.exp(zc - zc.max()).sum())
                worst_clean = max(worst_clean, abs(float(g.logp_mu[t]) - logc[y]))
    assert worst_clean > 0.1  # the learner's (clean) log-prob really differs


def test_noise_is_seeded_per_token_and_independent_of_the_batch(noisy, model):
    params = SamplingParams(max_new_tokens=N_NEW, seed=9)
    a = noisy.generate(PROMPTS, params, num_samples=2)
    b = noisy.generate(PROMPTS, params, num_samples=2)
    for ra, rb in zip(a, b):
        for ga, gb in zip(ra, rb):  # same seed: same tokens, bit-identical statistics
            np.testing.assert_array_equal(ga.response_ids, gb.response_ids)
            np.testing.assert_array_equal(ga.logp_mu, gb.logp_mu)
            np.testing.assert_array_equal(ga.entropy_mu, gb.entropy_mu)
    # another batch composition (prompt 3 replaced): prompts 0-2 unchanged
    c = noisy.generate(PROMPTS[:3] + [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]], params, num_samples=2)
    for i in range(3):
        for ga, gc in zip(a[i], c[i]):
            np.testing.assert_array_equal(ga.response_ids, gc.response_ids)
            np.testing.assert_allclose(ga.logp_mu, gc.logp_mu, atol=TOL)
    d = noisy.generate(PROMPTS, SamplingParams(max_new_tokens=N_NEW, seed=10), num_samples=2)
    assert any(not np.array_equal(ga.logp_mu, gd.logp_mu)
               for ra, rd in zip(a, d) for ga, gd in zip(ra, rd))


def test_perturb_logits_moments_and_off_switch():
    logits = jnp.asarray(np.random.default_rng(0).normal(size=(64, V)), jnp.float32)
    keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(3), i))(jnp.arange(64))
    np.testing.assert_array_equal(perturb_logits(logits, keys, 0.0), logits)
    diff = np.asarray(perturb_logits(logits, keys, 0.5) - logits)
    assert abs(diff.mean()) < 0.5 * 4 / np.sqrt(diff.size)  # 4 sigma of the mean
    assert abs(diff.std() / 0.5 - 1) < 0.02
    np.testing.assert_array_equal(perturb_logits(logits, keys, 0.5) - logits, diff)


def test_bad_noise_std_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="JaxSamplerConfig.logit_noise_std"):
        JaxSamplerConfig(logit_noise_std=-0.1)
    from experiments.run.config import SamplerSpec

    with pytest.raises(ValueError, match="sampler.logit_noise_std"):
        SamplerSpec(logit_noise_std=-1.0)
    with pytest.raises(ValueError, match="sampler.logit_noise_std must be 0 with sampler.kind='sglang'"):
        SamplerSpec(kind="sglang", server_urls=("http://x:1",), logit_noise_std=0.5)
