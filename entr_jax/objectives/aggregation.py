"""Loss aggregation modes shared by every objective, and the base config class.

Every mode is ``sum_{i,t} w_{i,t} l_{i,t} / D`` (algorithms.md section 2, "Aggregation
modes"), ``l`` the per-token loss (0 on rejected tokens), ``w`` a weight local to the row
and ``D`` a normaliser of the whole *optimizer batch*:

* ``token_mean``: ``w = 1``, ``D = N`` = loss tokens of the optimizer batch
  (``batch.num_loss_tokens``). Rejected tokens stay in the denominator (DAPO, CISPO, M2PO,
  ESTR as transcribed).
* ``token_mean_kept``: ``w = 1``, ``D`` = kept (not rejected) tokens of the optimizer batch
  (slime PR #657: rejected tokens are not counted). Which tokens are kept depends on the
  current policy, so ``D`` is a batch-level statistic (``batch.batch_stats
  ["num_kept_tokens"]``, see `entr_jax.objectives.common.kept_count`).
* ``seq_mean_token_mean``: ``w = 1/|o_i|`` (loss tokens of row i), ``D = G`` = rows of the
  optimizer batch with at least one loss token (``batch.num_sequences``). GRPO, GSPO,
  original IcePop: ``(1/G) sum_i (1/|o_i|) sum_t l_{i,t}``.
* ``seq_mean_token_sum_norm``: ``w = 1``, ``D = G * L_norm`` with ``L_norm`` a constant
  (Dr.GRPO, arXiv 2503.20783 section 3.1: the maximum generation length). ``L_norm`` is
  never the padded width: ``l_norm=None`` is refused in this mode.

Because ``w`` is local to a row and ``D`` is global, the loss of a batch split into
microbatches (each given the global normalisers) is the sum of the microbatch losses, and
so is its gradient: gradient accumulation is exact at any microbatch count. When the
normalisers are absent from the batch they are counted on the batch given, which is the
right value when that batch is the whole optimizer batch.
"""

from __future__ import annotations

import dataclasses
from typing import Literal, get_args

import jax
import jax.numpy as jnp

Aggregation = Literal["token_mean", "token_mean_kept", "seq_mean_token_mean", "seq_mean_token_sum_norm"]
AGGREGATIONS: tuple[str, ...] = get_args(Aggregation)


def aggregate(
    loss_tok: jax.Array,
    keep: jax.Array,
    loss_mask: jax.Array,
    num_loss_tokens: jax.Array,
    num_sequences: jax.Array,
    num_kept_tokens: jax.Array,
    mode: str,
    l_norm: float | None = None,
) -> jax.Array:
    """Reduces a ``[B, T]`` per-token loss to a scalar (see the module docstring).

    Args:
      loss_tok: ``[B, T] f32`` per-token loss (any value where ``keep`` is false; it is
        replaced by 0 with ``where``).
      keep: ``[B, T] bool`` tokens that enter the sum (a subset of ``loss_mask``).
      loss_mask: ``[B, T] bool`` response tokens (sequence lengths ``|o_i|``).
      num_loss_tokens: ``[] f32`` ``N`` of ``token_mean`` (optimizer batch).
      num_sequences: ``[] f32`` ``G`` of the two sequence modes (optimizer batch).
      num_kept_tokens: ``[] f32`` denominator of ``token_mean_kept`` (optimizer batch).
      mode: one of `AGGREGATIONS`.
      l_norm: constant ``L_norm`` of ``seq_mean_token_sum_norm`` (tokens, > 0).

    Every denominator is floored at 1, so an empty batch gives a loss of 0.

    Returns:
      ``[] f32`` loss.

    Raises:
      ValueError: unknown ``mode``, or ``l_norm`` is None in ``seq_mean_token_sum_norm``.
    """
    lt = jnp.where(keep, loss_tok, 0.0)
    if mode == "token_mean":
        return jnp.sum(lt) / jnp.maximum(num_loss_tokens, 1.0)
    if mode == "token_mean_kept":
        return jnp.sum(lt) / jnp.maximum(num_kept_tokens, 1.0)
    num_seq = jnp.maximum(num_sequences, 1.0)
    if mode == "seq_mean_token_mean":
        seq_len_B = jnp.sum(loss_mask, axis=1, dtype=jnp.float32)
        return jnp.sum(jnp.sum(lt, axis=1) / jnp.maximum(seq_len_B, 1.0)) / num_seq
    if mode == "seq_mean_token_sum_norm":
        _check_l_norm(l_norm)
        return jnp.sum(lt) / (num_seq * float(l_norm))
    raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {mode!r}")


def _check_l_norm(l_norm: float | None) -> None:
    if l_norm is None:
        raise ValueError(
            "aggregation 'seq_mean_token_sum_norm' needs l_norm (the constant L_norm of "
            "Dr.GRPO, e.g. the maximum response length in tokens), got None; the padded "
            "width is never used because it changes with the pad bucket"
        )


def denominator(
    num_loss_tokens: jax.Array,
    num_sequences: jax.Array,
    num_kept_tokens: jax.Array,
    mode: str,
    l_norm: float | None = None,
) -> jax.Array:
    """``D`` of `aggregate` before its floor at 1 (``[] f32``): ``num_loss_tokens``,
    ``num_kept_tokens``, ``num_sequences`` or ``num_sequences * l_norm`` by ``mode``.

    Logged as ``loss/normaliser``: the weight that pools the losses of several optimizer
    updates into the loss over all their tokens (`entr_jax.objectives.pooling`).

    Raises:
      ValueError: unknown ``mode``, or ``l_norm`` is None in ``seq_mean_token_sum_norm``.
    """
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    if mode == "token_mean":
        return f32(num_loss_tokens)
    if mode == "token_mean_kept":
        return f32(num_kept_tokens)
    if mode == "seq_mean_token_mean":
        return f32(num_sequences)
    if mode == "seq_mean_token_sum_norm":
        _check_l_norm(l_norm)
        return f32(num_sequences) * float(l_norm)
    raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {mode!r}")


def check_range(cls_name: str, field: str, value, lo=None, hi=None, lo_open=False, hi_open=False) -> None:
    """Raises ValueError naming ``cls_name.field`` when ``value`` is outside the range."""
    bad = value is None or not isinstance(value, (int, float)) or value != value
    if not bad and lo is not None:
        bad = value <= lo if lo_open else value < lo
    if not bad and hi is not None:
        bad = value >= hi if hi_open else value > hi
    if bad:
        lb = "(" if lo_open else "["
        rb = ")" if hi_open else "]"
        raise ValueError(
            f"{cls_name}.{field} must be a number in {lb}{'-inf' if lo is None else lo}, "
            f"{'inf' if hi is None else hi}{rb}, got {value!r}"
        )


def check_choice(cls_name: str, field: str, value, choices) -> None:
    """Raises ValueError naming ``cls_name.field`` when ``value`` is not in ``choices``."""
    if value not in choices:
        raise ValueError(f"{cls_name}.{field} must be one of {tuple(choices)}, got {value!r}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ObjectiveConfig:
    """Fields every objective config has.

    Attributes:
      aggregation: one of `AGGREGATIONS` (see the module docstring); each objective
        overrides the default with its paper's.
      l_norm: constant ``L_norm`` of ``seq_mean_token_sum_norm`` in tokens (> 0); required
        in that mode (the main job fills in the maximum response length when it is None).
    """

    aggregation: Aggregation = "token_mean"
    l_norm: float | None = None

    def __post_init__(self):
        name = type(self).__name__
        check_choice(name, "aggregation", self.aggregation, AGGREGATIONS)
        if self.l_norm is not None:
            check_range(name, "l_norm", self.l_norm, lo=0.0, lo_open=True)

    def _clip(self, low_field: str = "clip_low", high_field: str = "clip_high") -> None:
        name = type(self).__name__
        check_range(name, low_field, getattr(self, low_field), lo=0.0, hi=1.0, hi_open=True)
        check_range(name, high_field, getattr(self, high_field), lo=0.0)

    @property
    def mode(self) -> str:
        """The aggregation mode the loss uses (ENTR's ``denominator`` may change it)."""
        return self.aggregation

    def inputs(self) -> frozenset[str]:
        """Optional batch fields this configuration reads, among ``entropy_mu``,
        ``entropy_pi``, ``logp_prox`` and ``logp_ref`` (the learner computes ``logp_prox``
        and ``logp_ref`` only when they are listed here)."""
        return frozenset()

    def uses_batch_stats(self) -> bool:
        """Whether the loss needs a statistic of the current policy over the whole optimizer
        batch (`entr_jax.objectives.BATCH_STATS`); gated objectives need the kept-token
        count in ``token_mean_kept`` mode."""
        return False
