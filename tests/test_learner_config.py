"""The learner's knobs have one name, one default and one check (`learners.config`): the
run's `experiments.run.config.LearnerSpec` is `LearnerOptions` with its errors naming
``learner.<field>``, and `LearnerSpec.build` makes the `LearnerConfig` the job trains with;
the KL-under-filters refusal is one function both layers call."""

import dataclasses

import pytest

from experiments.run.config import LearnerSpec, RunConfig, SamplingSpec
from learners.config import LearnerConfig, LearnerOptions
from learners.contract import check_reference_filters
from learners.optim import OptimizerConfig

KNOBS = ("microbatches", "minibatches", "epochs", "mesh", "max_bad_steps", "logprob_chunk")


def test_the_run_and_the_library_share_names_and_defaults():
    names = [f.name for f in dataclasses.fields(LearnerOptions)]
    assert names == list(KNOBS) == [f.name for f in dataclasses.fields(LearnerSpec)]
    assert {f.name for f in dataclasses.fields(LearnerConfig)} >= set(KNOBS)
    spec, config = LearnerSpec(), LearnerConfig()
    assert [getattr(spec, k) for k in KNOBS] == [getattr(config, k) for k in KNOBS]
    assert config.max_bad_steps == 5  # the run's default, which the library had as 3


def test_build_carries_every_knob_and_the_sampling_distribution():
    spec = LearnerSpec(microbatches=4, minibatches=2, epochs=3, max_bad_steps=7, logprob_chunk=64)
    sampling = SamplingSpec(temperature=0.7, top_p=0.9, top_k=20, min_p=0.05)
    optimizer = OptimizerConfig(learning_rate=3e-4)
    config = spec.build(optimizer=optimizer, sampling=sampling, pad_id=3, seed=11, max_length=40)
    assert [getattr(config, k) for k in KNOBS] == [getattr(spec, k) for k in KNOBS]
    assert (config.temperature, config.top_p, config.top_k, config.min_p) == (0.7, 0.9, 20, 0.05)
    assert (config.optimizer, config.pad_id, config.seed, config.max_length) == (optimizer, 3, 11, 40)
    assert config.min_length == LearnerConfig().min_length


@pytest.mark.parametrize("field", ["microbatches", "minibatches", "epochs", "max_bad_steps",
                                   "logprob_chunk"])
def test_one_check_names_the_field_of_each_layer(field):
    with pytest.raises(ValueError, match=rf"^learner\.{field} must be >= 1, got 0$"):
        LearnerSpec(**{field: 0})
    with pytest.raises(ValueError, match=rf"^LearnerConfig\.{field} must be >= 1, got 0$"):
        LearnerConfig(**{field: 0})


def test_the_kl_refusal_is_one_text_named_by_each_caller():
    with pytest.raises(ValueError) as run:
        RunConfig(objective=dataclasses.replace(
            RunConfig().objective, name="grpo",
            grpo=dataclasses.replace(RunConfig().objective.grpo, kl_coef=0.04)),
            sampling=SamplingSpec(top_k=5))
    with pytest.raises(ValueError) as lib:
        check_reference_filters({"logp_ref"}, {"top_p": 1.0, "top_k": 5, "min_p": 0.0},
                                kl="kl_coef=0.04", kl_off="kl_coef=0",
                                field=lambda name, value: f"{name}={value}")
    assert str(run.value) == (
        str(lib.value).replace("kl_coef=0.04", "--objective.grpo.kl_coef 0.04")
        .replace("kl_coef=0", "--objective.grpo.kl_coef 0").replace("top_k=5", "--sampling.top_k 5")
        .replace("top_p=1.0 top_k=-1 min_p=0.0",
                 "--sampling.top_p 1.0 --sampling.top_k -1 --sampling.min_p 0.0"))
    check_reference_filters({"logp_prox"}, {"top_p": 0.5, "top_k": 5, "min_p": 0.1}, kl="",
                            kl_off="", field=str)  # no KL term: nothing to refuse
    check_reference_filters({"logp_ref"}, {"top_p": 1.0, "top_k": -1, "min_p": 0.0}, kl="",
                            kl_off="", field=str)  # no filter: nothing to refuse
