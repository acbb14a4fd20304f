"""Host-side batching: a list of `Trajectory`s -> one target-aligned, microbatched `Batch`.

The one place where the target alignment happens (``docs/design.md``, "One
batch layout"). For a trajectory with ``P`` prompt tokens and ``R`` response tokens the
row of ``tokens`` is ``prompt ++ response`` right-padded to ``L``; response token ``j``
sits at ``tokens[i, P + j]`` and every per-token array describes it at target index
``t = P + j - 1`` (index ``t`` of a ``[B, T]`` array describes ``tokens[:, t + 1]`` given
``tokens[:, :t + 1]``, ``T = L - 1``). Prompt targets (``t < P - 1``) and padding are never
loss tokens.

Non-finite behaviour statistics from a sampler never reach the device: their values are
zeroed and they are counted in the returned stats. A policy token whose ``logp_mu`` is
NaN/inf is taken out of ``loss_mask`` (every objective reads ``logp_mu``). A policy token
whose ``entropy_mu`` is NaN/inf is taken out of ``loss_mask`` only when
``drop_nonfinite_entropy`` (the objective reads ``entropy_mu``: ENTR with a behavior
entropy source); otherwise it stays a loss token and ``entropy_mu_valid`` marks its entropy
unknown, so entropy diagnostics skip it.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from entr_jax.types import BATCH_ROW_FIELDS, Batch, Trajectory

__all__ = ["bucket_length", "make_batch", "split_microbatches"]


def bucket_length(n: int, *, min_length: int = 16, max_length: int | None = None) -> int:
    """Smallest power of two ``>= max(n, min_length)`` (fewer distinct shapes, fewer compiles).

    Raises:
      ValueError: if that exceeds ``max_length`` (sequences are never truncated silently).
    """
    if n < 1:
        raise ValueError(f"bucket_length: n must be >= 1, got {n}")
    if min_length < 1:
        raise ValueError(f"bucket_length: min_length must be >= 1, got {min_length}")
    length = 1 << (max(n, min_length) - 1).bit_length()
    if max_length is not None:
        if n > max_length:
            raise ValueError(
                f"bucket_length: a sequence of {n} tokens exceeds max_length={max_length}"
            )
        length = min(length, max_length)
    return length


def _check_trajectory(i: int, traj: Trajectory) -> None:
    if len(traj.prompt_ids) < 1:
        raise ValueError(
            f"trajectories[{i}].prompt_ids is empty: the first response token needs a context"
        )
    r = len(traj.response_ids)
    for name in ("logp_mu", "entropy_mu", "token_version", "loss_mask"):
        if len(getattr(traj, name)) != r:
            raise ValueError(
                f"trajectories[{i}].{name} has {len(getattr(traj, name))} entries but "
                f"response_ids has {r}"
            )


def make_batch(
    trajectories: Sequence[Trajectory],
    advantages: Sequence[float] | np.ndarray,
    *,
    pad_id: int,
    num_microbatches: int = 1,
    row_multiple: int = 1,
    min_length: int = 16,
    max_length: int | None = None,
    length: int | None = None,
    drop_nonfinite_entropy: bool = False,
    num_minibatches: int = 1,
) -> tuple[Batch, dict[str, float]]:
    """Build one host (numpy) `Batch` from trajectories and per-trajectory advantages.

    Args:
      trajectories: ``N >= 1`` episodes; each needs ``len(prompt_ids) >= 1``.
      advantages: ``[N]`` float, the advantage ``A_i`` of trajectory ``i`` (e.g. from
        `entr_jax.advantages`); copied onto its loss tokens, 0 elsewhere.
      pad_id: token id used for padding (never a loss target).
      num_microbatches: ``M``, microbatches per mini-batch; every array of the result has
        a leading ``[P * M, B / (P * M)]`` pair of axes.
      row_multiple: the rows of each mini-batch are padded up to a multiple of
        ``num_microbatches * row_multiple`` (e.g. the number of devices on the batch mesh
        axes). Padding rows hold a single
        real token (``pad_id``, attention true, so no attention row is fully masked) and
        no loss tokens.
      min_length, max_length: bounds passed to `bucket_length` for ``L``.
      length: fixed ``L`` instead of bucketing (must hold the longest sequence).
      num_minibatches: ``P >= 1`` optimizer mini-batches (`learners.step`): the episodes
        are split into P consecutive chunks whose sizes differ by at most one (like
        ``numpy.array_split``), chunk j fills the first rows of mini-batch j and padding
        rows fill the rest, so every mini-batch holds its share of real rows. The result
        then has ``P * num_microbatches`` microbatches, mini-batch j being microbatches
        ``[j M, (j+1) M)``.
      drop_nonfinite_entropy: remove policy tokens with a non-finite ``entropy_mu`` from
        ``loss_mask`` (pass ``"entropy_mu" in objective.inputs``); otherwise they stay
        loss tokens with ``entropy_mu = 0`` and ``entropy_mu_valid = False``.

    Returns:
      ``(batch, stats)``. ``batch`` fields are numpy: ``tokens [M, b, L] int32``,
      ``attention_mask [M, b, L] bool``, ``loss_mask [M, b, T] bool``, ``advantages``,
      ``logp_mu``, ``entropy_mu [M, b, T] float32``, ``entropy_mu_valid [M, b, T] bool``
      (false only on policy tokens with a non-finite entropy), ``token_version
      [M, b, T] int32`` (``-1`` off policy tokens), ``logp_prox = logp_ref = None`` and
      ``num_loss_tokens [] float32 = max(#loss tokens, 1)`` over the whole batch (for
      reports; the learner counts its normalisers on device). ``M`` here is
      ``num_minibatches * num_microbatches``, ``b = B / M``. ``stats`` holds floats: ``batch/num_rows``
      (real rows), ``batch/padding_rows``, ``batch/length`` (``L``),
      ``batch/num_loss_tokens`` (the true count), ``batch/nonfinite_logp_mu``,
      ``batch/nonfinite_entropy_mu`` (policy tokens with a non-finite value),
      ``batch/nonfinite_entropy_dropped`` (policy tokens with a finite ``logp_mu`` removed
      from the loss for their entropy; 0 unless ``drop_nonfinite_entropy``) and
      ``batch/nonfinite_masked`` (policy tokens removed from the loss for either reason).

    Raises:
      ValueError: empty input, mismatched lengths (naming the trajectory and field), a
        sequence longer than ``max_length``/``length``, or bad sizes.
    """
    n = len(trajectories)
    if n == 0:
        raise ValueError("make_batch: trajectories is empty")
    adv = np.asarray(advantages, np.float32)
    if adv.shape != (n,):
        raise ValueError(f"make_batch: advantages has shape {adv.shape}, expected ({n},)")
    if not np.all(np.isfinite(adv)):
        raise ValueError("make_batch: advantages contains non-finite values")
    if num_microbatches < 1:
        raise ValueError(f"make_batch: num_microbatches must be >= 1, got {num_microbatches}")
    if row_multiple < 1:
        raise ValueError(f"make_batch: row_multiple must be >= 1, got {row_multiple}")
    if not 1 <= num_minibatches <= n:
        raise ValueError(f"make_batch: num_minibatches must be in [1, {n}] (one episode per "
                         f"mini-batch at least), got {num_minibatches}")
    for i, traj in enumerate(trajectories):
        _check_trajectory(i, traj)

    seq_lens = [len(t.prompt_ids) + len(t.response_ids) for t in trajectories]
    longest = max(seq_lens)
    if length is None:
        length = bucket_length(max(longest, 2), min_length=min_length, max_length=max_length)
    elif longest > length:
        raise ValueError(f"make_batch: a sequence of {longest} tokens exceeds length={length}")
    if length < 2:
        raise ValueError(f"make_batch: length must be >= 2, got {length}")
    unit = num_microbatches * row_multiple
    chunks = np.array_split(np.arange(n), num_minibatches)
    rows_per_mini = -(-len(chunks[0]) // unit) * unit
    rows = num_minibatches * rows_per_mini
    row_of = np.concatenate([j * rows_per_mini + np.arange(len(c)) for j, c in enumerate(chunks)])
    t_len = length - 1

    tokens = np.full((rows, length), pad_id, np.int32)
    attention_mask = np.zeros((rows, length), bool)
    loss_mask = np.zeros((rows, t_len), bool)
    advantages_bt = np.zeros((rows, t_len), np.float32)
    logp_mu = np.zeros((rows, t_len), np.float32)
    entropy_mu = np.zeros((rows, t_len), np.float32)
    token_version = np.full((rows, t_len), -1, np.int32)
    entropy_valid = np.ones((rows, t_len), bool)
    bad_logp = bad_entropy = bad_masked = dropped_entropy = 0

    for k, traj in enumerate(trajectories):
        i = int(row_of[k])
        p, r = len(traj.prompt_ids), len(traj.response_ids)
        tokens[i, :p] = traj.prompt_ids
        tokens[i, p : p + r] = traj.response_ids
        attention_mask[i, : p + r] = True
        span = slice(p - 1, p - 1 + r)  # target index of response token j is p - 1 + j
        policy = np.asarray(traj.loss_mask, bool)
        lp = np.asarray(traj.logp_mu, np.float32)
        ent = np.asarray(traj.entropy_mu, np.float32)
        finite_lp, finite_ent = np.isfinite(lp), np.isfinite(ent)
        bad_logp += int(np.sum(policy & ~finite_lp))
        bad_entropy += int(np.sum(policy & ~finite_ent))
        keep = policy & finite_lp
        if drop_nonfinite_entropy:
            dropped_entropy += int(np.sum(keep & ~finite_ent))
            keep = keep & finite_ent
        bad_masked += int(np.sum(policy & ~keep))
        loss_mask[i, span] = keep
        logp_mu[i, span] = np.where(keep, lp, 0.0)
        entropy_mu[i, span] = np.where(keep & finite_ent, ent, 0.0)
        entropy_valid[i, span] = ~(policy & ~finite_ent)
        advantages_bt[i, span] = np.where(keep, adv[k], 0.0)
        token_version[i, span] = np.where(policy, np.asarray(traj.token_version, np.int32), -1)
    padding = np.ones(rows, bool)
    padding[row_of] = False
    attention_mask[padding, 0] = True  # padding rows: one real token, no loss

    count = int(loss_mask.sum())
    batch = Batch(
        tokens=tokens,
        attention_mask=attention_mask,
        loss_mask=loss_mask,
        advantages=advantages_bt,
        logp_mu=logp_mu,
        entropy_mu=entropy_mu,
        token_version=token_version,
        logp_prox=None,
        logp_ref=None,
        num_loss_tokens=np.float32(max(count, 1)),
        entropy_mu_valid=entropy_valid,
    )
    stats = {
        "batch/num_rows": float(n),
        "batch/padding_rows": float(rows - n),
        "batch/length": float(length),
        "batch/num_loss_tokens": float(count),
        "batch/nonfinite_logp_mu": float(bad_logp),
        "batch/nonfinite_entropy_mu": float(bad_entropy),
        "batch/nonfinite_entropy_dropped": float(dropped_entropy),
        "batch/nonfinite_masked": float(bad_masked),
    }
    return split_microbatches(batch, num_minibatches * num_microbatches), stats


def split_microbatches(batch: Batch, num_microbatches: int) -> Batch:
    """Reshape every ``[B, ...]`` field to ``[num_microbatches, B / num_microbatches, ...]``.

    Row ``r`` of the input lands in microbatch ``r // (B / M)``. ``num_loss_tokens`` (a
    scalar normaliser for the whole batch) is left as it is.

    Raises:
      ValueError: if ``B`` is not divisible by ``num_microbatches``.
    """
    rows = batch.tokens.shape[0]
    if num_microbatches < 1 or rows % num_microbatches:
        raise ValueError(
            f"split_microbatches: {rows} rows do not split into num_microbatches="
            f"{num_microbatches}"
        )

    def split(x):
        if x is None:
            return None
        x = np.asarray(x)
        return x.reshape((num_microbatches, rows // num_microbatches) + x.shape[1:])

    return batch.replace(**{name: split(getattr(batch, name)) for name in BATCH_ROW_FIELDS})
