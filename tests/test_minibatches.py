"""PPO mini-batches and epochs (issue 11, item 3): several optimizer updates per rollout
batch, ``logp_prox`` computed once before the first, one policy version per rollout batch,
the optimizer's own counter for the schedule, and the documented reduction of the
per-update metrics. Tiny real `Decoder` (conftest's ``tiny_policy``)."""

import jax
import numpy as np
import optax
import pytest

from entr_jax.objectives import make_objective
from entr_jax.sharding import MeshConfig
from entr_jax.types import Trajectory
from learners.learner import Learner, LearnerConfig
from learners.optim import OptimizerConfig

N = 8


def _config(minibatches: int, epochs: int) -> LearnerConfig:
    return LearnerConfig(mesh=MeshConfig(1, 1, 1), minibatches=minibatches, epochs=epochs,
                         optimizer=OptimizerConfig(learning_rate=0.05, max_grad_norm=None),
                         logprob_chunk=8, min_length=16)


def _learner(module_fn, minibatches: int, epochs: int) -> Learner:
    return Learner(module_fn, _config(minibatches, epochs), objective=make_objective("decoupled_ppo"),
                   devices=jax.devices()[:1])


def _off_policy(trajs, logp0, shift=2.0):
    """The same episodes with ``logp_mu = logp_pi(theta_0) - shift`` on every response token:
    strongly off-policy (``prox/mu = e^2 = 7.39``)."""
    out = []
    for i, t in enumerate(trajs):
        p, r = len(t.prompt_ids), len(t.response_ids)
        lp = logp0[i, p - 1:p - 1 + r] - shift
        out.append(Trajectory(prompt_ids=t.prompt_ids, response_ids=t.response_ids, logp_mu=lp.astype(np.float32),
                              entropy_mu=t.entropy_mu, token_version=np.zeros(r, np.int32),
                              loss_mask=np.ones(r, bool)))
    return out


@pytest.fixture(scope="module")
def rounds(tiny_policy, random_trajectories):
    """Learner A: 2 mini-batches x 2 epochs on 8 episodes. Learner B: one update on A's
    first mini-batch (episodes 0-3), i.e. A's weights after its first update."""
    trajs, _ = random_trajectories(N, seed=5)
    adv = np.array([1.0, -1.0, 0.5, -0.5, 1.5, -1.5, 1.0, -1.0], np.float32)
    a = _learner(tiny_policy, 2, 2)
    logp0 = a.token_logprobs(trajs)["logp_pi"]
    trajs = _off_policy(trajs, logp0)
    prepared, _ = a.prepare(trajs, adv)
    calls = []
    inner = a.logprob_fn
    a.logprob_fn = lambda *args: (calls.append(1), inner(*args))[1]
    a.train_on(trajs, adv)
    per_update = jax.device_get(a.last_update_metrics)
    count_1 = int(optax.tree_utils.tree_get_all_with_path(a.state.opt_state, "count")[0][1])
    version_1 = a.version
    round_metrics = a.flush()
    b = _learner(tiny_policy, 1, 1)
    b.train_on(trajs[:4], adv[:4])
    logp1_second_half = b.token_logprobs(trajs[4:])
    return dict(trajs=trajs, adv=adv, a=a, logp0=logp0, prepared=prepared, calls=len(calls),
                per_update=per_update, round=round_metrics, count_1=count_1, version_1=version_1,
                logp1=logp1_second_half)


def test_proximal_log_probs_are_computed_once_before_the_first_update(rounds):
    prox = np.asarray(rounds["prepared"].logp_prox).reshape(N, -1)
    mask = np.asarray(rounds["prepared"].loss_mask).reshape(N, -1)
    np.testing.assert_allclose(prox[mask], rounds["logp0"][mask], atol=1e-6)
    assert rounds["calls"] == 1  # one log-prob pass (prox) for 4 optimizer updates


def test_clip_fires_after_the_first_update_and_matches_hand_computation(rounds):
    per = rounds["per_update"]
    clip = per["clip/frac_low"] + per["clip/frac_high"]
    # update 0: pi == prox exactly on mini-batch 0, so u = 1 and nothing is clipped
    assert clip[0] == 0.0
    # update 1: mini-batch 1 (episodes 4-7) under the weights after update 0, which B has.
    # u = exp(logp_pi - logp_prox); clipped: u > 1.2 with A > 0 or u < 0.8 with A < 0.
    logp1, mask = rounds["logp1"]["logp_pi"], rounds["logp1"]["loss_mask"]
    prox = rounds["logp0"][4:]
    u = np.exp(logp1 - prox)
    a_row = rounds["adv"][4:, None]
    clipped = ((u > 1.2) & (a_row > 0)) | ((u < 0.8) & (a_row < 0))
    expected = clipped[mask].mean()
    assert expected > 0.1  # the trust region around prox is active
    assert clip[1] == pytest.approx(expected, abs=1e-6)
    assert clip[2] > 0 and clip[3] > 0  # second epoch: both mini-batches away from prox
    # off-policy weight prox/mu = e^2 on every token (the decoupled correction)
    np.testing.assert_allclose(per["is_weight/max"], np.e ** 2, rtol=1e-5)
    assert np.all(per["ratio_mode/decoupled"] == 1.0)


def test_version_counts_rollout_batches_and_the_optimizer_counts_updates(rounds):
    assert rounds["version_1"] == 1 and rounds["count_1"] == 4
    assert rounds["round"]["train/version"] == 1.0 and rounds["round"]["train/optimizer_steps"] == 4.0
    a = rounds["a"]
    a.train_on(rounds["trajs"], rounds["adv"])
    assert a.version == 2
    assert int(optax.tree_utils.tree_get_all_with_path(a.state.opt_state, "count")[0][1]) == 8
    m = a.flush()
    assert m["train/applied"] == 4.0 and m["staleness/mean"] == 1.0  # tokens of version 0, learner at 1


def test_round_metrics_are_the_documented_reduction(rounds):
    per, got = rounds["per_update"], rounds["round"]
    n = per["tokens/num_loss_tokens"]
    total = int(np.sum(rounds["prepared"].loss_mask))
    assert n.sum() == 2 * total  # each token trained on once per epoch
    assert got["tokens/num_loss_tokens"] == total
    assert got["hist/log_ratio_pi_mu"].sum() == total
    # decoupled_ppo's token_mean: the loss normaliser is the loss tokens
    np.testing.assert_array_equal(per["loss/normaliser"], n)
    for key in ("loss", "clip/frac_high", "clip/frac_low", "mask/fraction", "entropy_pi/mean"):
        assert got[key] == pytest.approx(float(np.sum(n * per[key]) / n.sum()), rel=1e-5), key
    kept = per["tokens/kept"]
    assert got["is_weight/mean"] == pytest.approx(float(np.sum(kept * per["is_weight/mean"]) / kept.sum()), rel=1e-5)
    assert got["is_weight/max"] == pytest.approx(float(per["is_weight/max"].max()))
    assert got["log_ratio_pi_mu/abs_max"] == pytest.approx(float(per["log_ratio_pi_mu/abs_max"].max()))
    assert got["train/grad_norm"] == pytest.approx(float(per["train/grad_norm"].mean()), rel=1e-6)
    # the largest of the 4 updates' norms, not their mean (a spike in one update)
    assert got["train/grad_norm_max"] == pytest.approx(float(per["train/grad_norm"].max()), rel=1e-6)
    assert got["train/grad_norm_max"] > got["train/grad_norm"]
    assert got["train/applied"] == 4.0 and got["train/skipped"] == 0.0
    assert got["train/learning_rate"] == pytest.approx(0.05)
    # on-policy weights would give ESS 1; with w = pi/mu ~ e^2 * u the spread lowers it
    assert 0.0 < got["ess/token_fraction"] <= 1.0 and 0.0 < got["ess/seq_fraction"] <= 1.0


@pytest.mark.parametrize("name, kw", [
    ("entr", {}),
    ("trm", {"aggregation": "seq_mean_token_mean", "threshold": 0.3}),
], ids=["entr", "trm_seq_mean"])
def test_with_frozen_weights_the_k_update_record_is_the_one_update_record(name, kw, tiny_policy,
                                                                         random_trajectories):
    """SGD with learning rate 0: every update scores its tokens with the same weights, so
    the tokens of P = 2 mini-batches (x E = 2 epochs) are exactly those of one update on
    the whole rollout batch, and so must be the record: means pooled with their own
    denominators, maxima maxed, counts of one pass. The per-update means weighted by loss
    tokens gave e.g. log_ratio_pi_mu/abs_max as the mean of the two mini-batches' maxima,
    entropy_mu/mean weighted by loss tokens instead of tokens with a known entropy, and
    the ESS fractions as means of ratios."""
    from entr_jax.sharding import make_mesh
    from learners.batching import make_batch
    from learners.distributed import shard_batch
    from learners.state import create_train_state
    from learners.step import make_train_step

    trajs, _ = random_trajectories(N, seed=7)
    t0 = trajs[0]
    ent = t0.entropy_mu.copy()
    ent[0] = np.nan  # unknown behavior entropy: excluded from entropy_mu/mean, still a loss token
    trajs[0] = Trajectory(prompt_ids=t0.prompt_ids, response_ids=t0.response_ids, logp_mu=t0.logp_mu,
                          entropy_mu=ent, token_version=t0.token_version, loss_mask=np.ones(len(ent), bool))
    adv = np.array([1.0, -1.0, 0.5, -0.5, 1.5, -1.5, 1.0, -1.0], np.float32)
    objective = make_objective(name, **kw)
    mesh = make_mesh(MeshConfig(1, 1, 1), jax.devices()[:1])
    tx = optax.sgd(0.0)
    records = {}
    for p, e in ((1, 1), (2, 1), (2, 2)):
        state, shardings = create_train_state(tiny_policy, tx, mesh)
        host, _ = make_batch(trajs, adv, pad_id=0, num_minibatches=p, min_length=16)
        step = make_train_step("rl", tx, shardings, mesh, objective=objective, chunk_size=8,
                               num_minibatches=p, num_epochs=e)
        records[p, e] = jax.device_get(step(state, shard_batch(host, mesh))[1])
    ref = records[1, 1]
    assert 0 < ref["mask/fraction"] < 1 and ref["tokens/entropy_mu_unknown"] == 1.0
    for (p, e), got in records.items():
        assert got["train/optimizer_steps"] == p * e
        for key, value in ref.items():
            if key.startswith("train/"):
                continue  # numbers of updates, gradient norms: per update by design
            np.testing.assert_allclose(got[key], value, rtol=1e-5, atol=1e-6, err_msg=f"P={p} E={e} {key}")
