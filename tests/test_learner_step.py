"""The sharded learner step: parity across meshes and microbatches, no retrace, skip rule,
SFT loss and the no-grad log-prob function, on a tiny real `Decoder`."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from entr_jax.logprobs import token_logprobs_entropy
from entr_jax.objectives import make_objective
from entr_jax.sharding import MeshConfig, make_mesh
from learners.batching import make_batch
from learners.distributed import shard_batch
from learners.learner import NonFiniteError, NonFiniteGuard
from learners.state import create_train_state
from learners.step import HISTOGRAM_EDGES, make_logprob_fn, make_train_step

TOL = 1e-5  # f32 ops
LR = 0.5  # SGD: new params = params - LR * grads, so parameters reveal the gradients
# GRPO's seq_mean_token_mean: with per-microbatch row counts (the first build) M = 4 gave
# 4x the loss and gradient, so the microbatch parity below pins the optimizer-batch
# normalisers at model level.
OBJECTIVE = make_objective("grpo")


@pytest.fixture(scope="module")
def data(random_trajectories):
    """32 episodes and their advantages (seed 0)."""
    return random_trajectories(32)


def _run(module_fn, data, mesh_cfg, n_micro, devices, steps=2):
    mesh = make_mesh(mesh_cfg, devices)
    tx = optax.sgd(LR)
    state, shardings = create_train_state(module_fn, tx, mesh)
    host, _ = make_batch(*data, pad_id=0, num_microbatches=n_micro, min_length=16)
    step = make_train_step("rl", tx, shardings, mesh, objective=OBJECTIVE, chunk_size=8)
    params0 = jax.device_get(state.params)
    history, params1 = [], None
    for _ in range(steps):
        state, metrics, _ = step(state, shard_batch(host, mesh))
        history.append(jax.device_get(metrics))
        if params1 is None:
            params1 = jax.device_get(state.params)
    return dict(params0=params0, params1=params1, params=jax.device_get(state.params), metrics=history,
                step=step, state=state, shardings=shardings, mesh=mesh)


@pytest.fixture(scope="module")
def single(tiny_policy, data):
    return _run(tiny_policy, data, MeshConfig(1, 1, 1), 1, jax.devices()[:1])


@pytest.fixture(scope="module")
def data2_fsdp4(tiny_policy, data):
    return _run(tiny_policy, data, MeshConfig(2, 4, 1), 1, None)


@pytest.fixture(scope="module")
def fsdp8_micro4(tiny_policy, data):
    return _run(tiny_policy, data, MeshConfig(1, 8, 1), 4, None)


def _leaves(tree):
    return jax.tree.leaves(tree)


def _assert_same(a, b):
    for x, y in zip(_leaves(a["params"]), _leaves(b["params"])):
        np.testing.assert_allclose(x, y, atol=TOL, rtol=TOL)
    for ma, mb in zip(a["metrics"], b["metrics"]):
        for key in ("loss", "train/grad_norm", "train/param_norm", "entropy_pi/mean",
                    "staleness/mean", "tokens/num_loss_tokens"):
            np.testing.assert_allclose(ma[key], mb[key], atol=TOL, rtol=TOL, err_msg=key)


@pytest.mark.parametrize("other", ["data2_fsdp4", "fsdp8_micro4"])
def test_sharded_and_microbatched_match_single_device(single, other, request):
    res = request.getfixturevalue(other)
    _assert_same(single, res)
    # the parameters really are sharded across the 8 devices
    emb = res["state"].params["embed_tokens"]["embedding"].get_value()
    assert len(emb.sharding.device_set) == 8
    assert emb.addressable_shards[0].data.shape[1] < 16  # the tiny policy's hidden size


def test_first_step_gradients_match_jax_grad(fsdp8_micro4, tiny_policy, data):
    # SGD: (params0 - params1) / LR is exactly the accumulated gradient of the step
    res = fsdp8_micro4
    grads = jax.tree.map(lambda p0, p1: (p0 - p1) / LR, res["params0"], res["params1"])
    graphdef, params, other = nnx.split(tiny_policy(), nnx.Param, ...)
    host, _ = make_batch(*data, pad_id=0, num_microbatches=1, min_length=16)
    flat = host.replace(**{k: jnp.asarray(getattr(host, k)[0]) for k in (
        "tokens", "attention_mask", "loss_mask", "advantages", "logp_mu", "entropy_mu",
        "token_version")}, num_loss_tokens=jnp.float32(host.num_loss_tokens))

    @jax.jit
    def full_batch_grad(p):
        def loss(p):
            m = nnx.merge(graphdef, p, other)
            logp, _ = token_logprobs_entropy(m, flat.tokens, flat.attention_mask, chunk_size=8)
            return OBJECTIVE(logp, flat)[0]
        return jax.grad(loss)(p)

    ref = full_batch_grad(params)
    for g, r in zip(_leaves(grads), _leaves(ref)):
        np.testing.assert_allclose(g, r, atol=TOL, rtol=1e-4)
    assert float(optax.global_norm(ref)) > 1e-3  # the gradient is not trivially zero


def test_not_retraced(single, fsdp8_micro4):
    for res in (single, fsdp8_micro4):
        assert res["step"].num_traces == 1
        assert res["step"].fn._cache_size() == 1


def test_metrics_values(single, data):
    m = single["metrics"][0]
    host, stats = make_batch(*data, pad_id=0, min_length=16)
    mask = host.loss_mask[0]
    assert m["tokens/num_loss_tokens"] == stats["batch/num_loss_tokens"] == mask.sum()
    staleness = 0 - host.token_version[0][mask]  # version 0 before the first step
    np.testing.assert_allclose(m["staleness/mean"], staleness.mean(), rtol=TOL)
    assert m["staleness/max"] == staleness.max()
    assert m["train/skipped"] == 0.0 and m["train/version"] == 1.0
    assert m["train/applied"] == 1.0 and m["train/optimizer_steps"] == 1.0
    assert single["metrics"][1]["train/version"] == 2.0
    assert m["hist/log_ratio_pi_mu"].sum() == mask.sum()
    assert m["hist/entropy_pi"].shape == (len(HISTOGRAM_EDGES["hist/entropy_pi"]) - 1,)
    assert np.isfinite(m["loss"]) and m["train/update_norm"] > 0


def test_nonfinite_update_is_skipped(single, data):
    state, step, mesh = single["state"], single["step"], single["mesh"]
    host, _ = make_batch(*data, pad_id=0, min_length=16)
    bad = host.replace(advantages=np.where(host.loss_mask, np.nan, 0.0).astype(np.float32))
    before = jax.device_get(state.params)
    version, count = int(state.version), int(state.step)
    state, metrics, _ = step(state, shard_batch(bad, mesh))
    m = jax.device_get(metrics)
    assert m["train/skipped"] == 1.0 and m["train/update_norm"] == 0.0
    assert m["train/nonfinite_loss"] == 1.0
    assert int(state.version) == version and int(state.step) == count + 1
    for x, y in zip(_leaves(before), _leaves(jax.device_get(state.params))):
        np.testing.assert_array_equal(x, y)
    assert step.num_traces == 1  # same shapes, no retrace
    single["state"] = state


def test_guard_stops_after_n_consecutive():
    guard = NonFiniteGuard(2)
    bad = {"train/skipped": 1.0, "loss": float("nan"), "train/grad_norm": float("nan")}
    good = {"train/skipped": 0.0, "loss": 1.0}
    guard.update(0, bad)
    guard.update(1, good)  # resets the run
    guard.update(2, bad)
    with pytest.raises(NonFiniteError, match=r"step 3: 2 consecutive steps with non-finite loss"):
        guard.update(3, bad)
    guard = NonFiniteGuard(1)
    with pytest.raises(NonFiniteError, match="train/grad_norm"):
        guard.update(7, {"train/skipped": 1.0, "loss": 2.0, "train/grad_norm": float("inf")})


@pytest.mark.parametrize("filters, named", [
    ({"top_p": 0.9}, "LearnerConfig.top_p=0.9"),
    ({"top_k": 5, "min_p": 0.1}, "LearnerConfig.top_k=5, LearnerConfig.min_p=0.1"),
])
def test_kl_to_the_reference_is_refused_under_sampling_filters(filters, named, tiny_policy):
    # logp_ref would be the reference's filtered log-prob: -1e4 on sampled tokens outside its
    # kept set, where k3 = exp(-20) + 20 - 1 = 19.0 is a constant without gradient.
    from learners.learner import Learner, LearnerConfig

    kl = make_objective("grpo", kl_coef=0.04)
    with pytest.raises(ValueError, match=r"grpo's kl_coef=0\.04 \(a k3 KL penalty.*" + named.replace(".", r"\.")):
        Learner(tiny_policy, LearnerConfig(mesh=MeshConfig(1, 1, 1), **filters), objective=kl,
                devices=jax.devices()[:1])


@pytest.mark.parametrize("where, bad", [("response_ids", 24), ("prompt_ids", -1)])
def test_token_ids_outside_the_vocabulary_are_refused(where, bad, tiny_policy,
                                                      random_trajectories):
    """An id the embedding has no row for embeds as NaN: the step would be skipped as
    non-finite, silently; the learner refuses it, naming the trajectory and the id."""
    import dataclasses

    from learners.learner import Learner, LearnerConfig

    learner = Learner(tiny_policy, LearnerConfig(mesh=MeshConfig(1, 1, 1)),
                      objective=make_objective("grpo"), devices=jax.devices()[:1])
    trajs, _ = random_trajectories(4)
    ids = getattr(trajs[2], where).copy()
    ids[-1] = bad
    trajs[2] = dataclasses.replace(trajs[2], **{where: ids})
    message = (f"trajectories[2].{where} holds token id {bad}, outside the model's vocabulary "
               "[0, 24)")
    for call in (lambda: learner.train_on(trajs, [1.0] * 4), lambda: learner.sft_on(trajs)):
        with pytest.raises(ValueError, match=re.escape(message)):
            call()


def test_sft_step_and_logprob_fn_on_sharded_mesh(data2_fsdp4, data):
    mesh, shardings = data2_fsdp4["mesh"], data2_fsdp4["shardings"]
    state = data2_fsdp4["state"]
    host, _ = make_batch(*data, pad_id=0, num_microbatches=2, min_length=16)
    batch = shard_batch(host, mesh)
    logprob = make_logprob_fn(shardings, mesh, chunk_size=8)
    logp, ent = logprob(state.params, state.other, batch)
    assert logp.shape == host.logp_mu.shape
    model = nnx.merge(shardings.graphdef, jax.device_get(state.params), jax.device_get(state.other))
    ref_logp, ref_ent = token_logprobs_entropy(
        model, jnp.asarray(host.tokens.reshape(32, -1)),
        jnp.asarray(host.attention_mask.reshape(32, -1)), chunk_size=8)
    np.testing.assert_allclose(np.asarray(logp).reshape(32, -1), ref_logp, atol=TOL)
    np.testing.assert_allclose(np.asarray(ent).reshape(32, -1), ref_ent, atol=TOL)

    tx = optax.sgd(LR)
    sft = make_train_step("sft", tx, shardings, mesh, chunk_size=8)
    expected = -np.sum(np.where(host.loss_mask.reshape(32, -1), ref_logp, 0.0)) / host.num_loss_tokens
    state2, metrics, _ = sft(state, batch)
    np.testing.assert_allclose(float(metrics["loss"]), expected, rtol=TOL)
    assert float(metrics["train/version"]) == float(state2.version)
    data2_fsdp4["state"] = state2
