"""The jitted pieces of `JaxSampler`: prefill, a chunk of KV-cache decode steps, the
KV-cache recomputation used after a weight swap, and the conversion of installed weights
to the serving layout and dtype.

Shapes (all static per compilation, chosen from buckets by `JaxSampler`): ``B`` rows
(batch bucket), ``P`` prompt slots (prompt bucket), ``N`` response slots (new-token
bucket), ``M <= P + N`` cache slots (the cache grows between chunks, `grow_cache`), ``V``
vocabulary. Prompts are right-padded: row ``b`` holds its prompt at ``[0, len_b)``.
Response token ``t`` (``t = 0, 1, ...``; "decode step t") of row ``b`` sits at position
``len_b + t``. Step 0 is sampled from the prefill logits at position ``len_b - 1``; step
``t >= 1`` feeds token ``t - 1`` at position ``len_b + t - 1``. Everything that varies per
request (lengths, sampling parameters, seed, stop set, max new tokens, weight version, the
weights themselves) is a traced argument; the one static shape that varies inside a
bucket is the cache's number of slots (at most ``log2((P + N) / P) + 1`` sizes,
`grow_cache`), so once a bucket has run its responses to full length nothing recompiles
in it.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx, struct

from entr_jax.model.decoder import KVCache, init_cache, relayout
from samplers.jax_mismatch import perturb_logits
from samplers.jax_sampling import sample_tokens

Array = jax.Array


@struct.dataclass
class SamplingArgs:
    """Traced per-call sampling inputs.

    Attributes:
      temperature, top_p, min_p: f32 scalars; top_k: int32 scalar (-1 = off).
      stop_mask: ``[V]`` bool, true on stop token ids.
      max_new_tokens: int32 scalar (<= N).
      seed: uint32 scalar (``SamplingParams.seed mod 2**32``).
    """

    temperature: Array
    top_k: Array
    top_p: Array
    min_p: Array
    stop_mask: Array
    max_new_tokens: Array
    seed: Array


@struct.dataclass
class DecodeState:
    """Loop carry of one device batch.

    Attributes:
      cache: `KVCache` in the model's layout (stacked ``[N, B, K, head_dim, M]`` keys or
        one array per layer; `entr_jax.model.decoder`).
      step: int32 scalar, index of the next response token to sample.
      last: ``[B]`` int32, the most recently sampled token (fed at the next step).
      done: ``[B]`` bool, row finished (stop token or budget) or a padding row.
      tokens: ``[B, N]`` int32 response tokens; logp_mu, entropy_mu: ``[B, N]`` f32;
      token_version: ``[B, N]`` int32 (entries past a row's end are meaningless).
    """

    cache: KVCache
    step: Array
    last: Array
    done: Array
    tokens: Array
    logp_mu: Array
    entropy_mu: Array
    token_version: Array


def _row_keys(seed: Array, row_ids: Array, step: Array) -> Array:
    """``[B]`` keys ``fold_in(fold_in(fold_in(key(seed), prompt_index), sample_index), step)``."""
    base = jax.random.key(seed)

    def one(ids):
        k = jax.random.fold_in(jax.random.fold_in(base, ids[0]), ids[1])
        return jax.random.fold_in(k, step)

    return jax.vmap(one)(row_ids)


def _record(state: DecodeState, logits_BV, row_ids, args: SamplingArgs, version, filtered,
            logit_noise_std: float = 0.0):
    """Samples response token ``state.step`` for every row and writes it into the buffers
    (with the synthetic mismatch of `samplers.jax_mismatch` when ``logit_noise_std > 0``)."""
    keys = _row_keys(args.seed, row_ids, state.step)
    if logit_noise_std:
        logits_BV = perturb_logits(logits_BV, keys, logit_noise_std)
    tok, logp, ent = sample_tokens(
        logits_BV, keys, args.temperature, args.top_k, args.top_p, args.min_p,
        filtered=filtered,
    )
    col = state.step
    live = ~state.done
    finished = args.stop_mask[tok] | (col + 1 >= args.max_new_tokens)
    return state.replace(
        step=col + 1,
        last=tok,
        done=state.done | (live & finished),
        tokens=state.tokens.at[:, col].set(tok),
        logp_mu=state.logp_mu.at[:, col].set(logp),
        entropy_mu=state.entropy_mu.at[:, col].set(ent),
        token_version=state.token_version.at[:, col].set(version),
    )


def prefill(graphdef, params, prompts, lens, pad_rows, row_ids, args: SamplingArgs, version,
            *, max_new_bucket: int, cache_len: int, cache_dtype: Any, filtered: bool,
            logit_noise_std: float = 0.0) -> DecodeState:
    """Runs the prompt through the model and samples response token 0.

    Args:
      graphdef: static NNX graph of the `Decoder` (closed over by the jit wrapper).
      params: the NNX ``State`` of its parameters.
      prompts: ``[B, P]`` int32 right-padded prompts; lens: ``[B]`` int32 in ``[1, P]``.
      pad_rows: ``[B]`` bool, true on rows that only fill the batch bucket (born done).
      row_ids: ``[B, 2]`` int32 (prompt index, sample index) of each row, for its key.
      args: `SamplingArgs`; version: int32 scalar stored in ``token_version``.
      max_new_bucket: N; cache_len: cache slots allocated now (``P <= cache_len <= P + N``;
        see `grow_cache`); cache_dtype: dtype of the KV cache; filtered: static filter flag.
      logit_noise_std: static; synthetic logit noise (`samplers.jax_mismatch`), 0 = off.
    Returns:
      `DecodeState` with ``step = 1``.
    """
    model = nnx.merge(graphdef, params)
    b, p = prompts.shape
    if not p <= cache_len <= p + max_new_bucket:
        raise ValueError(f"cache_len {cache_len} outside [{p}, {p + max_new_bucket}]")
    cache = init_cache(model.config, b, cache_len, cache_dtype, stacked=model.scan_layers)
    positions = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32)[None, :], (b, p))
    logits, cache = model.decode(prompts, positions, cache)
    last_logits = jnp.take_along_axis(logits, (lens - 1)[:, None, None], axis=1)[:, 0]
    shape = (b, max_new_bucket)
    state = DecodeState(
        cache=cache, step=jnp.int32(0), last=jnp.zeros((b,), jnp.int32), done=pad_rows,
        tokens=jnp.zeros(shape, jnp.int32), logp_mu=jnp.zeros(shape, jnp.float32),
        entropy_mu=jnp.zeros(shape, jnp.float32), token_version=jnp.zeros(shape, jnp.int32),
    )
    return _record(state, last_logits, row_ids, args, version, filtered, logit_noise_std)


def decode_chunk(graphdef, params, state: DecodeState, lens, row_ids, args: SamplingArgs,
                 version, end_step, *, filtered: bool,
                 logit_noise_std: float = 0.0) -> DecodeState:
    """Decode steps ``state.step, ..., end_step - 1`` in a ``lax.while_loop``, stopping as
    soon as every row is done. ``end_step`` is traced (no recompile per chunk length);
    ``logit_noise_std`` is static (see `prefill`)."""
    model = nnx.merge(graphdef, params)

    def cond(s: DecodeState):
        return (s.step < end_step) & ~jnp.all(s.done)

    def body(s: DecodeState):
        positions = (lens + s.step - 1)[:, None]
        logits, cache = model.decode(s.last[:, None], positions, s.cache)
        return _record(s.replace(cache=cache), logits[:, 0], row_ids, args, version, filtered,
                       logit_noise_std)

    return jax.lax.while_loop(cond, body, state)


def grow_cache(state: DecodeState, *, length: int) -> DecodeState:
    """The same state with the KV cache extended to ``length`` slots (static, at least the
    current number), the new slots zero. A decode step reads every slot of the cache
    (masked ones included), so the sampler allocates only the slots the next chunk of
    steps can write and grows the cache between chunks (`samplers.jax_sampler`)."""
    m = state.cache.max_len
    if length < m:
        raise ValueError(f"grow_cache: length {length} < current {m} slots")
    def pad(x, axis):  # the slot axis: last of a key, second to last of a value
        widths = [(0, 0)] * x.ndim
        widths[axis] = (0, length - m)
        return jnp.pad(x, widths)

    k = jax.tree.map(lambda x: pad(x, -1), state.cache.k)
    v = jax.tree.map(lambda x: pad(x, -2), state.cache.v)
    return state.replace(cache=KVCache(k=k, v=v))


def recompute_cache(graphdef, params, state: DecodeState, prompts, lens, *,
                    length: int | None = None) -> DecodeState:
    """Rebuilds the KV cache under ``params`` from the prompt and the response tokens so far
    (after an in-flight weight swap), so later tokens are exactly those weights'
    conditionals. ``length`` (static; None = all ``M`` slots): the first ``length`` slots
    are recomputed, the rest zeroed; it must cover every row's prompt and response so far
    (``P + step``). Slots past a row's current length get harmless values that are never
    attended before being overwritten."""
    model = nnx.merge(graphdef, params)
    b, p = prompts.shape
    m = state.cache.max_len if length is None else length
    n = state.tokens.shape[1]
    seq = jnp.zeros((b, m), jnp.int32).at[:, :p].set(prompts)
    cols = jnp.arange(n, dtype=jnp.int32)[None, :]
    target = jnp.where(cols < state.step, lens[:, None] + cols, m)  # >= m: dropped
    rows = jnp.broadcast_to(jnp.arange(b, dtype=jnp.int32)[:, None], (b, n))
    seq = seq.at[rows, target].set(state.tokens, mode="drop")
    positions = jnp.broadcast_to(jnp.arange(m, dtype=jnp.int32)[None, :], (b, m))
    cache = jax.tree.map(jnp.zeros_like, state.cache)
    _, cache = model.decode(seq, positions, cache)
    return state.replace(cache=cache)


def serving_weights(params, *, num_layers: int, dtype, stacked: bool):
    """``params`` (a `Decoder` state in either block layout) in the sampler's layout
    (stacked or one buffer per layer, `entr_jax.model.decoder.relayout`) and ``dtype``;
    jitted by `JaxSampler`: one program per incoming structure."""
    return jax.tree.map(lambda x: x.astype(dtype), relayout(params, num_layers, stacked=stacked))
