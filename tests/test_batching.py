"""Host batching: target alignment on a hand-built example, masking, microbatch split."""

import numpy as np
import pytest

from entr_jax.types import Trajectory
from learners.batching import bucket_length, make_batch, split_microbatches


def _traj(prompt, response, logp, ent, version, mask):
    return Trajectory(
        prompt_ids=np.asarray(prompt, np.int32),
        response_ids=np.asarray(response, np.int32),
        logp_mu=np.asarray(logp, np.float32),
        entropy_mu=np.asarray(ent, np.float32),
        token_version=np.asarray(version, np.int32),
        loss_mask=np.asarray(mask, bool),
    )


@pytest.fixture(scope="module")
def example():
    trajs = [
        # prompt 5 6 | response 7 (policy) 8 (tool token) 9 (policy)
        _traj([5, 6], [7, 8, 9], [-0.1, 0.0, -0.3], [1.0, 0.0, 3.0], [0, -1, 1], [1, 0, 1]),
        # prompt 3 | response 4 (NaN logp_mu from the sampler) 2
        _traj([3], [4, 2], [np.nan, -0.5], [0.5, 0.7], [3, 3], [1, 1]),
        # prompt 1 2 3 4 | response 10 (entropy inf)  -> masked; then 11
        _traj([1, 2, 3, 4], [10, 11], [-1.0, -2.0], [np.inf, 0.25], [2, 2], [1, 1]),
    ]
    return make_batch(trajs, [1.5, -0.5, 2.0], pad_id=0, num_microbatches=2, min_length=4,
                      drop_nonfinite_entropy=True)


def _example_trajs():
    return [
        _traj([5, 6], [7, 8, 9], [-0.1, 0.0, -0.3], [1.0, 0.0, 3.0], [0, -1, 1], [1, 0, 1]),
        _traj([3], [4, 2], [np.nan, -0.5], [0.5, 0.7], [3, 3], [1, 1]),
        _traj([1, 2, 3, 4], [10, 11], [-1.0, -2.0], [np.inf, 0.25], [2, 2], [1, 1]),
    ]


def test_alignment_hand_built(example):
    batch, stats = example
    F, T = False, True
    assert batch.tokens.shape == (2, 2, 8) and batch.loss_mask.shape == (2, 2, 7)
    tokens = batch.tokens.reshape(4, 8)
    np.testing.assert_array_equal(
        tokens,
        [[5, 6, 7, 8, 9, 0, 0, 0], [3, 4, 2, 0, 0, 0, 0, 0], [1, 2, 3, 4, 10, 11, 0, 0], [0] * 8],
    )
    np.testing.assert_array_equal(
        batch.attention_mask.reshape(4, 8).sum(1), [5, 3, 6, 1]  # padding row: 1 real token
    )
    np.testing.assert_array_equal(
        batch.loss_mask.reshape(4, 7),
        [
            [F, T, F, T, F, F, F],  # t=1 -> 7, t=2 -> 8 (tool), t=3 -> 9
            [F, T, F, F, F, F, F],  # t=0 -> 4 (NaN logp, masked), t=1 -> 2
            [F, F, F, F, T, F, F],  # t=3 -> 10 (inf entropy, masked), t=4 -> 11
            [F] * 7,
        ],
    )
    # every loss token's target is tokens[:, t + 1]
    rows, cols = np.nonzero(batch.loss_mask.reshape(4, 7))
    np.testing.assert_array_equal(tokens[rows, cols + 1], [7, 9, 2, 11])
    logp = batch.logp_mu.reshape(4, 7)
    np.testing.assert_array_equal(logp[0], np.float32([0, -0.1, 0, -0.3, 0, 0, 0]))
    np.testing.assert_array_equal(logp[1], [0, -0.5, 0, 0, 0, 0, 0])  # NaN zeroed
    np.testing.assert_array_equal(logp[2], [0, 0, 0, 0, -2.0, 0, 0])
    ent = batch.entropy_mu.reshape(4, 7)
    np.testing.assert_array_equal(ent[2], [0, 0, 0, 0, 0.25, 0, 0])  # inf zeroed
    np.testing.assert_array_equal(
        batch.advantages.reshape(4, 7),
        [[0, 1.5, 0, 1.5, 0, 0, 0], [0, -0.5, 0, 0, 0, 0, 0], [0, 0, 0, 0, 2.0, 0, 0], [0] * 7],
    )
    np.testing.assert_array_equal(
        batch.token_version.reshape(4, 7),
        [[-1, 0, -1, 1, -1, -1, -1], [3, 3, -1, -1, -1, -1, -1],
         [-1, -1, -1, 2, 2, -1, -1], [-1] * 7],
    )
    assert batch.num_loss_tokens == np.float32(4.0)
    assert batch.logp_prox is None and batch.logp_ref is None
    assert stats == {
        "batch/num_rows": 3.0, "batch/padding_rows": 1.0, "batch/length": 8.0,
        "batch/num_loss_tokens": 4.0, "batch/nonfinite_logp_mu": 1.0,
        "batch/nonfinite_entropy_mu": 1.0, "batch/nonfinite_entropy_dropped": 1.0,
        "batch/nonfinite_masked": 2.0,
    }
    assert batch.entropy_mu_valid.reshape(4, 7)[2, 3] == False  # noqa: E712
    for name in ("logp_mu", "entropy_mu", "advantages"):
        assert np.all(np.isfinite(getattr(batch, name)))


def test_nonfinite_entropy_kept_for_objectives_that_do_not_read_it():
    """Without ``drop_nonfinite_entropy`` (the objective never reads entropy_mu) the token
    with entropy inf stays a loss token, its entropy is zeroed and marked unknown, and only
    the NaN log-prob token leaves the loss."""
    batch, stats = make_batch(_example_trajs(), [1.5, -0.5, 2.0], pad_id=0, num_microbatches=2,
                              min_length=4)
    mask = batch.loss_mask.reshape(4, 7)
    assert mask[2, 3] and mask.sum() == 5  # 7, 9 | 2 | 10 (inf entropy), 11
    assert batch.entropy_mu.reshape(4, 7)[2, 3] == 0.0
    assert batch.advantages.reshape(4, 7)[2, 3] == 2.0
    valid = batch.entropy_mu_valid.reshape(4, 7)
    assert not valid[2, 3] and valid.sum() == 4 * 7 - 1
    assert (stats["batch/nonfinite_entropy_mu"], stats["batch/nonfinite_entropy_dropped"],
            stats["batch/nonfinite_masked"], stats["batch/num_loss_tokens"]) == (1.0, 0.0, 1.0, 5.0)
    assert np.all(np.isfinite(batch.entropy_mu))


def test_entropy_diagnostics_exclude_unknown_entropies():
    """entropy_mu/mean and the ratio-by-entropy buckets skip the token whose entropy is
    unknown (it would otherwise count as entropy 0); it is counted instead."""
    import jax.numpy as jnp

    from learners.diagnostics import finalize, token_sums

    batch, _ = make_batch(_example_trajs(), [1.5, -0.5, 2.0], pad_id=0, min_length=4)
    b = batch.replace(**{k: jnp.asarray(getattr(batch, k)) for k in (
        "tokens", "attention_mask", "loss_mask", "advantages", "logp_mu", "entropy_mu",
        "token_version", "entropy_mu_valid")})
    logp = b.logp_mu + 0.1  # delta = 0.1 on every loss token
    m = finalize(*token_sums(logp, jnp.ones_like(logp), b, jnp.int32(3)))
    # known entropies on loss tokens: 1.0 (tok 7), 3.0 (tok 9), 0.7 (tok 2), 0.25 (tok 11)
    assert float(m["entropy_mu/mean"]) == pytest.approx((1.0 + 3.0 + 0.7 + 0.25) / 4)
    assert float(m["tokens/entropy_mu_unknown"]) == 1.0 and float(m["tokens/num_loss_tokens"]) == 5.0
    # buckets [0,.1) [.1,.5) [.5,1) [1,2) [2,inf): .25 | .7 | 1.0 | 3.0 -> no token in b0
    counts = [float(m[f"ratio_by_entropy/b{i}/count"]) for i in range(5)]
    assert counts == [0.0, 1.0, 1.0, 1.0, 1.0]
    assert float(m["ratio_by_entropy/b1/delta_sq_mean"]) == pytest.approx(0.01, rel=1e-4)
    # ESS/N of pi/mu: every token weight is e^0.1, so 1; sequence weights W = exp(sum delta)
    # = [e^.2, e^.1, e^.2] (2, 1 and 2 loss tokens): 3.547977^2 / (3 * 4.205053) = 0.997858
    assert float(m["ess/token_fraction"]) == pytest.approx(1.0, abs=1e-6)
    assert float(m["ess/seq_fraction"]) == pytest.approx(0.997858, abs=2e-6)


def test_microbatch_split_row_order(example):
    batch, _ = example
    # row r of the flat batch lands in microbatch r // 2
    np.testing.assert_array_equal(batch.tokens[1, 0], [1, 2, 3, 4, 10, 11, 0, 0])
    again = split_microbatches(batch.replace(
        **{k: getattr(batch, k).reshape((4,) + getattr(batch, k).shape[2:])
           for k in ("tokens", "attention_mask", "loss_mask", "advantages", "logp_mu",
                     "entropy_mu", "entropy_mu_valid", "token_version")}), 4)
    assert again.tokens.shape == (4, 1, 8)
    with pytest.raises(ValueError, match="num_microbatches=3"):
        split_microbatches(again.replace(tokens=again.tokens.reshape(4, 8)), 3)


def test_bucket_length():
    assert [bucket_length(n, min_length=4) for n in (1, 4, 5, 8, 9, 100)] == [4, 4, 8, 8, 16, 128]
    assert bucket_length(100, min_length=4, max_length=120) == 120
    with pytest.raises(ValueError, match="max_length=50"):
        bucket_length(51, max_length=50)


def test_bad_inputs_name_the_field():
    good = _traj([1], [2], [-1.0], [1.0], [0], [1])
    with pytest.raises(ValueError, match=r"trajectories\[1\].prompt_ids"):
        make_batch([good, _traj([], [2], [-1.0], [1.0], [0], [1])], [0.0, 0.0], pad_id=0)
    with pytest.raises(ValueError, match=r"trajectories\[0\].loss_mask"):
        make_batch([_traj([1], [2, 3], [-1.0, -1.0], [1.0, 1.0], [0, 0], [1])], [0.0], pad_id=0)
    with pytest.raises(ValueError, match="advantages has shape"):
        make_batch([good], [0.0, 1.0], pad_id=0)
    with pytest.raises(ValueError, match="length=2"):
        make_batch([_traj([1], [2, 3], [-1.0] * 2, [1.0] * 2, [0] * 2, [1] * 2)], [0.0],
                   pad_id=0, length=2)


def test_all_masked_batch_has_unit_normaliser():
    batch, stats = make_batch([_traj([1], [2], [np.nan], [1.0], [0], [1])], [1.0], pad_id=0)
    assert stats["batch/num_loss_tokens"] == 0.0 and batch.num_loss_tokens == 1.0
    assert not batch.loss_mask.any()


def test_minibatches_share_the_real_rows():
    """7 episodes, 2 mini-batches, rows padded to multiples of 8 (devices): episodes 0-3 fill
    mini-batch 0 and 4-6 mini-batch 1 (array_split), padding after each, so no mini-batch
    is left with padding only."""
    trajs = [_traj([1], [2 + i], [-1.0], [1.0], [0], [1]) for i in range(7)]
    batch, stats = make_batch(trajs, np.arange(7, dtype=np.float32), pad_id=0, num_minibatches=2,
                              num_microbatches=2, row_multiple=4, min_length=4)
    assert batch.tokens.shape == (4, 4, 4)  # 2 mini-batches x 2 microbatches x 4 rows
    first_target = batch.tokens.reshape(16, 4)[:, 1]
    np.testing.assert_array_equal(first_target, [2, 3, 4, 5] + [0] * 4 + [6, 7, 8] + [0] * 5)
    adv = batch.advantages.reshape(16, 3)[:, 0]
    np.testing.assert_array_equal(adv, [0, 1, 2, 3] + [0] * 4 + [4, 5, 6] + [0] * 5)
    assert batch.loss_mask.reshape(2, 8, 3).sum(axis=(1, 2)).tolist() == [4, 3]
    assert batch.attention_mask.reshape(16, 4).sum(1).tolist() == [2] * 4 + [1] * 4 + [2] * 3 + [1] * 5
    assert stats["batch/padding_rows"] == 9.0
    with pytest.raises(ValueError, match="num_minibatches"):
        make_batch(trajs[:1], [0.0], pad_id=0, num_minibatches=2)
