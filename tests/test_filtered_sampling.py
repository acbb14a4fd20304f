"""A library user who samples with a filter (top-k) and builds trajectories the natural
way, `Trajectory.from_generation`: the generation records the sampling parameters, the
trajectory carries them, and a learner that scores another distribution refuses them with
the fix; one that scores the filter gets on-policy log-ratios of 0."""

import jax
import numpy as np
import pytest

from entr_jax.interfaces import SamplingParams
from entr_jax.types import BehaviorParams, Trajectory
from learners.learner import Learner, LearnerConfig
from learners.optim import OptimizerConfig
from samplers.jax_sampler import JaxSampler, JaxSamplerConfig

PROMPTS = [[5, 17, 3], [6, 2, 2, 9], [8, 1, 7, 7, 3]]
TOP_K = 3


@pytest.fixture(scope="module")
def filtered(tiny_policy):
    """Trajectories sampled with top-k 3 from ``tiny_policy``'s weights (2 per prompt)."""
    sampler = JaxSampler(tiny_policy(), config=JaxSamplerConfig(max_batch_size=8,
                                                                min_prompt_bucket=8))
    params = SamplingParams(temperature=1.0, top_k=TOP_K, max_new_tokens=6, seed=0)
    gens = sampler.generate(PROMPTS, params, num_samples=2)
    return [Trajectory.from_generation(g, group_id=i) for i, row in enumerate(gens) for g in row]


def learner(tiny_policy, **filters):
    return Learner(tiny_policy, LearnerConfig(optimizer=OptimizerConfig(), **filters),
                   devices=jax.devices()[:1])


def test_the_trajectories_carry_the_filter(filtered):
    assert len(filtered) == 6
    assert {t.behavior for t in filtered} == {BehaviorParams(1.0, TOP_K, 1.0, 0.0)}


def test_an_unfiltered_learner_refuses_them_with_the_fix(filtered, tiny_policy):
    with pytest.raises(ValueError) as err:
        learner(tiny_policy).token_logprobs(filtered)
    assert str(err.value) == (
        "trajectories[0] was sampled with temperature=1.0, top_k=3, top_p=1.0, min_p=0.0, "
        "but the learner scores temperature=1.0, top_k=-1, top_p=1.0, min_p=0.0: logp_pi "
        "would not be the distribution logp_mu describes. Build the Learner with "
        "LearnerConfig(temperature=1.0, top_k=3, top_p=1.0, min_p=0.0), the sampler's "
        "settings")


def test_a_learner_scoring_the_filter_is_on_policy(filtered, tiny_policy):
    arrays = learner(tiny_policy, top_k=TOP_K).token_logprobs(filtered)
    mask = arrays["loss_mask"].astype(bool)
    delta = (arrays["logp_pi"] - arrays["logp_mu"])[mask]
    assert mask.sum() == sum(len(t.response_ids) for t in filtered)
    assert np.max(np.abs(delta)) < 1e-5
