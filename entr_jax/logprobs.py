"""Per-token log-probabilities and full-vocabulary entropies, computed in sequence chunks.

The learner needs, for every target token, ``logp_pi = log pi(y_t | s_t)`` (with
gradient) and the full-vocabulary Shannon entropy ``H_t = -sum_w pi(w|s_t) log pi(w|s_t)``
(detached; ENTR/ESTR, arXiv 2607.22186, Sec. 3.3 "Entropy: which policy, and how").
Materialising the ``[B, T, V]`` f32 logits for a real vocabulary (V = 151,936 for
Qwen2) costs ``4 * B * T * V`` bytes, several times over once the backward pass keeps the
softmax. Here the sequence is split into chunks of ``chunk_size`` positions; each chunk's
logits are produced, reduced to ``[B, C]`` numbers and dropped. The per-chunk function is
wrapped in ``jax.checkpoint`` and mapped with ``lax.map`` (a scan), so the backward pass
recomputes one chunk of logits at a time as well: peak memory follows ``B * C * V``,
not ``B * T * V``.

Formulas (natural log, nats), with ``z = logits / temperature`` and ``m = max_w z_w``:

* ``logsumexp(z) = m + log sum_w exp(z_w - m)``
* ``logp_t = z_{y_t} - logsumexp(z) = (z_{y_t} - m) - log sum_w exp(z_w - m)``  (log-softmax)
* ``H_t = logsumexp(z) - sum_w softmax(z)_w z_w
       = log sum_w exp(z_w - m) - sum_w softmax(z)_w (z_w - m)``        (entropy)

The second form of ``H_t`` works on shifted logits, so large logits do not cancel
catastrophically, and ``-inf`` logits (masked vocabulary entries, probability 0)
contribute ``0 * 0`` instead of ``0 * -inf = nan``. It is clamped at 0 against rounding.

Sampling filters. With ``top_k``/``top_p``/``min_p`` set (as the sampler was), ``z`` is
first replaced by `entr_jax.sampling_filter.filter_logits` of it, the same transform the
embedded sampler samples from, so ``logp`` and ``H`` describe the filtered, renormalised
distribution and on-policy ``logp_pi == logp_mu``. The keep set is computed from
``stop_gradient(z)``; gradient flows through the kept entries' tempered logits only. A
target outside the kept set has probability 0 under the filtered policy; its ``logp`` is
returned as the finite stand-in `LOGP_OUTSIDE_KEPT` (``-1e4``) with zero gradient, so no
``-inf`` reaches the objectives' arithmetic: every ratio there is ``exp(clip(logp_pi -
logp_mu, -20, 20))``, which for such a token is ``exp(-20) ~ 2.1e-9`` (for any
``logp_mu > -9980``), with no gradient through the saturated clip. Without filters the
code path is the unfiltered one (no sort). The filtered path sorts ``[B, C, V]`` once per
chunk.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from entr_jax.sampling_filter import check_filter, filter_active, keep_mask

Array = jax.Array

__all__ = [
    "CHUNK_SIZE",
    "LOGP_OUTSIDE_KEPT",
    "chunked_logprobs_entropy",
    "logprobs_entropy_from_logits",
    "naive_logprobs_entropy",
    "token_logprobs_entropy",
]

CHUNK_SIZE = 128
"""Default positions per chunk of the chunked log-prob pass (`chunked_logprobs_entropy`;
the learner's ``logprob_chunk``): one name, one default."""

LOGP_OUTSIDE_KEPT = -1.0e4
"""``logp`` reported for a target outside the filter's kept set (true value ``-inf``)."""


def _check_temperature(temperature: Any) -> None:
    if isinstance(temperature, (int, float)) and not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")


def logprobs_entropy_from_logits(logits: Array, targets: Array) -> tuple[Array, Array]:
    """Log-prob of ``targets`` and detached entropy from (temperature-scaled) logits.

    Used by the learner and, for ``logp_mu``/``entropy_mu``, by the embedded sampler.

    Args:
      logits: ``[..., V]`` f32, already divided by the temperature; ``-inf`` entries have
        probability 0 (at least one entry per row must be finite).
      targets: ``[...]`` integer token ids in ``[0, V)``.

    Returns:
      ``(logp [...] f32, entropy [...] f32)`` in nats (formulas in the module docstring);
      ``logp`` is ``-inf`` for a ``-inf`` target; the entropy carries no gradient.
    """
    # Shift by the (detached) row max: log-softmax is invariant to it, and the shifted
    # values keep the precision that ``z_y - logsumexp(z)`` loses for |z| >> 1.
    m = jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    shifted = logits - m
    exp_shifted = jnp.exp(shifted)  # exp(-inf) = 0 for masked entries
    log_sum_exp = jnp.log(jnp.sum(exp_shifted, axis=-1))
    target_shifted = jnp.take_along_axis(shifted, targets[..., None].astype(jnp.int32), axis=-1)
    logp = target_shifted[..., 0] - log_sum_exp

    shifted_sg = jax.lax.stop_gradient(shifted)
    probs = jax.lax.stop_gradient(exp_shifted / jnp.exp(log_sum_exp)[..., None])
    # p * shifted with a -inf entry (p = 0) must count 0, not 0 * -inf = NaN. Raising -inf
    # to the f32 minimum does it (0 * min = -0) and leaves every finite entry as it is, in
    # an elementwise op the reduction fuses; ``where(isfinite(s), s, 0)`` gave the same
    # values through a [.., V] temporary of its own (1% of the benchmark learner step).
    finite_shifted = jnp.maximum(shifted_sg, jnp.finfo(jnp.float32).min)
    entropy = jax.lax.stop_gradient(log_sum_exp) - jnp.sum(probs * finite_shifted, axis=-1)
    entropy = jnp.maximum(entropy, 0.0)
    return logp, entropy


def _filtered_logprobs_entropy(
    z: Array, targets: Array, top_k: int, top_p: float, min_p: float
) -> tuple[Array, Array]:
    """`logprobs_entropy_from_logits` of the filtered distribution (module docstring);
    the unfiltered call when no filter is on (no sort)."""
    if not filter_active(top_k, top_p, min_p):
        return logprobs_entropy_from_logits(z, targets)
    keep = keep_mask(z, top_k, top_p, min_p)
    logp, entropy = logprobs_entropy_from_logits(jnp.where(keep, z, -jnp.inf), targets)
    target_kept = jnp.take_along_axis(keep, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return jnp.where(target_kept, logp, LOGP_OUTSIDE_KEPT), entropy


def naive_logprobs_entropy(
    logits: Array,
    targets: Array,
    *,
    temperature: float = 1.0,
    top_k: int = -1,
    top_p: float = 1.0,
    min_p: float = 0.0,
) -> tuple[Array, Array]:
    """Reference log-prob and entropy from fully materialised logits.

    Args:
      logits: ``[B, T, V]`` any float dtype (computed in f32); ``logits[b, t]`` is the
        next-token distribution that produced ``targets[b, t]``.
      targets: ``[B, T]`` integer token ids in ``[0, V)``.
      temperature: positive scalar; the distribution is ``softmax(logits / temperature)``.
      top_k, top_p, min_p: sampling filters (Python values; -1 / 1 / 0 = off), applied to
        the tempered logits as in `entr_jax.sampling_filter`.

    Returns:
      ``(logp [B, T] f32, entropy [B, T] f32)`` in nats. ``logp`` is differentiable in
      ``logits`` (kept entries only); ``entropy`` is detached (``stop_gradient``); a target
      outside the kept set gets ``logp = LOGP_OUTSIDE_KEPT``.

    Raises:
      ValueError: if the shapes disagree, ``temperature <= 0`` or a filter value is out
        of range.
    """
    if logits.ndim != 3:
        raise ValueError(f"logits must be [B, T, V], got shape {logits.shape}")
    if targets.shape != logits.shape[:2]:
        raise ValueError(
            f"targets shape {targets.shape} does not match logits [B, T] = {logits.shape[:2]}"
        )
    _check_temperature(temperature)
    check_filter(top_k, top_p, min_p)
    z = logits.astype(jnp.float32) / jnp.asarray(temperature, jnp.float32)
    return _filtered_logprobs_entropy(z, targets, top_k, top_p, min_p)


def chunked_logprobs_entropy(
    hidden: Array,
    targets: Array,
    unembed: Callable[[Array], Array],
    *,
    chunk_size: int = CHUNK_SIZE,
    temperature: float = 1.0,
    top_k: int = -1,
    top_p: float = 1.0,
    min_p: float = 0.0,
) -> tuple[Array, Array]:
    """Log-prob of each target token and full-vocabulary entropy, chunked over T.

    The ``[B, T, V]`` logits never exist at once, in the forward or the backward pass:
    ``unembed`` is applied to ``chunk_size`` positions at a time inside a rematerialised
    (``jax.checkpoint``) function mapped over chunks with ``lax.map``.

    Args:
      hidden: ``[B, T, D]`` final hidden states (after the final norm); ``hidden[b, t]``
        produces the distribution of ``targets[b, t]``. Any float dtype.
      targets: ``[B, T]`` integer token ids in ``[0, V)``. Padded positions must still
        hold a valid id (e.g. the pad id); mask them downstream.
      unembed: maps ``[..., D]`` hidden states to ``[..., V]`` logits (e.g.
        ``model.lm_logits``); it may close over parameters, and gradients flow into them.
        Its output is cast to f32.
      chunk_size: positions per chunk (>= 1). ``T`` need not be a multiple: the last
        chunk is padded internally and the padding is sliced off. Peak memory of the
        logits is about ``4 * B * min(chunk_size, T) * V`` bytes (x ~3 in the backward).
      temperature: positive scalar; the distribution is ``softmax(logits / temperature)``.
      top_k, top_p, min_p: sampling filters (Python values, static; -1 / 1 / 0 = off):
        the distribution becomes the filtered, renormalised one the sampler drew from
        (`entr_jax.sampling_filter`); the filtered path sorts each chunk's logits.

    Returns:
      ``(logp [B, T] f32, entropy [B, T] f32)`` in nats: ``logp[b, t] = log
      mu(targets[b, t])`` with ``mu = softmax(filter(unembed(hidden[b, t]) /
      temperature))`` (no filter: the tempered softmax), differentiable in ``hidden`` and
      in whatever ``unembed`` closes over; ``LOGP_OUTSIDE_KEPT`` (no gradient) where the
      target is outside the kept set; ``entropy[b, t]`` is the Shannon entropy of the same
      distribution, detached (ENTR/ESTR arXiv 2607.22186, Sec. 3.3: log-sum-exp minus the
      expectation of the logits).

    Raises:
      ValueError: if ``hidden`` is not rank 3, ``targets`` is not ``[B, T]``,
        ``chunk_size < 1``, ``temperature <= 0`` or a filter value is out of range.
    """
    if hidden.ndim != 3:
        raise ValueError(f"hidden must be [B, T, D], got shape {hidden.shape}")
    batch, seq, dim = hidden.shape
    if targets.shape != (batch, seq):
        raise ValueError(f"targets shape {targets.shape} does not match hidden [B, T] = {(batch, seq)}")
    if not jnp.issubdtype(targets.dtype, jnp.integer):
        raise ValueError(f"targets must be an integer array, got dtype {targets.dtype}")
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    _check_temperature(temperature)
    check_filter(top_k, top_p, min_p)
    if seq == 0:
        empty = jnp.zeros((batch, 0), jnp.float32)
        return empty, empty

    chunk = min(chunk_size, seq)
    n_chunks = -(-seq // chunk)
    pad = n_chunks * chunk - seq
    targets = targets.astype(jnp.int32)
    if pad:
        hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
        targets = jnp.pad(targets, ((0, 0), (0, pad)))
    # [N, B, C, D] and [N, B, C]: chunks lead so lax.map scans over them.
    hidden_chunks = hidden.reshape(batch, n_chunks, chunk, dim).transpose(1, 0, 2, 3)
    target_chunks = targets.reshape(batch, n_chunks, chunk).transpose(1, 0, 2)

    @jax.checkpoint
    def one_chunk(xs: tuple[Array, Array]) -> tuple[Array, Array]:
        h_BCD, y_BC = xs
        logits_BCV = unembed(h_BCD).astype(jnp.float32) / jnp.asarray(temperature, jnp.float32)
        return _filtered_logprobs_entropy(logits_BCV, y_BC, top_k, top_p, min_p)

    logp_NBC, entropy_NBC = jax.lax.map(one_chunk, (hidden_chunks, target_chunks))
    logp = logp_NBC.transpose(1, 0, 2).reshape(batch, n_chunks * chunk)[:, :seq]
    entropy = entropy_NBC.transpose(1, 0, 2).reshape(batch, n_chunks * chunk)[:, :seq]
    return logp, jax.lax.stop_gradient(entropy)


def token_logprobs_entropy(
    model: Any,
    tokens: Array,
    attention_mask: Array | None = None,
    *,
    chunk_size: int = CHUNK_SIZE,
    temperature: float = 1.0,
    top_k: int = -1,
    top_p: float = 1.0,
    min_p: float = 0.0,
) -> tuple[Array, Array]:
    """Per-target-token log-prob and entropy of a causal LM over a token batch.

    Runs ``model.hidden_states(tokens, attention_mask)`` once, then applies
    ``model.lm_logits`` chunkwise through `chunked_logprobs_entropy`.

    Args:
      model: an object with ``hidden_states(input_ids [B, L] int32, attention_mask [B, L]
        bool | None) -> [B, L, D]`` (after the final norm) and ``lm_logits([..., D]) ->
        [..., V] f32`` (e.g. ``entr_jax.model.Decoder``).
      tokens: ``[B, L]`` int32 prompt + response, right-padded (design.md "One batch layout").
      attention_mask: ``[B, L]`` bool, true on real tokens, or None for all-true.
      chunk_size: positions per chunk, see `chunked_logprobs_entropy`.
      temperature: positive scalar applied to the logits.
      top_k, top_p, min_p: the sampler's filters (static; -1 / 1 / 0 = off), see
        `chunked_logprobs_entropy`.

    Returns:
      ``(logp [B, T] f32, entropy [B, T] f32)`` with ``T = L - 1``, aligned to the target
      token: index ``t`` describes ``tokens[:, t + 1]`` given ``tokens[:, :t + 1]``.
      Positions whose target is padding hold finite but meaningless values; mask them.

    Raises:
      ValueError: if ``tokens`` is not ``[B, L]`` with ``L >= 2`` or the mask shape differs.
    """
    if tokens.ndim != 2 or tokens.shape[1] < 2:
        raise ValueError(f"tokens must be [B, L] with L >= 2, got shape {tokens.shape}")
    if attention_mask is not None and attention_mask.shape != tokens.shape:
        raise ValueError(
            f"attention_mask shape {attention_mask.shape} does not match tokens {tokens.shape}"
        )
    hidden_BLD = model.hidden_states(tokens, attention_mask)
    return chunked_logprobs_entropy(
        hidden_BLD[:, :-1],
        tokens[:, 1:],
        model.lm_logits,
        chunk_size=chunk_size,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
    )
