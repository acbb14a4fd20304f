"""Loss aggregation modes shared by every objective, and the base config class.

Modes (algorithms.md section 2, "Aggregation modes"); ``l`` is the per-token loss, already
0 on rejected tokens:

* ``token_mean``: ``sum_{i,t} l_{i,t} / N`` with ``N = batch.num_loss_tokens`` (the
  global normaliser of the optimizer batch) or, when that is None, the number of loss
  tokens of this batch. Rejected tokens stay in the denominator (DAPO, CISPO, M2PO,
  ESTR as transcribed). Additive over microbatches that share the global ``N``.
* ``token_mean_kept``: ``sum l / max(#kept tokens of this batch, 1)`` (slime PR #657:
  rejected tokens are not counted). Not additive over microbatches.
* ``seq_mean_token_mean``: ``(1/G) sum_i (1/|o_i|) sum_t l_{i,t}`` (GRPO, GSPO, original
  IcePop), ``|o_i|`` = loss tokens of row i, ``G`` = rows of this batch with at least one
  loss token.
* ``seq_mean_token_sum_norm``: ``(1/(G * l_norm)) sum_{i,t} l_{i,t}`` (Dr.GRPO,
  arXiv 2503.20783 section 3.1), ``l_norm`` a constant (e.g. the max generation length);
  None means the padded width T of the batch.

The two sequence modes count rows of the batch passed in (the microbatch under gradient
accumulation).
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
    mode: str,
    l_norm: float | None = None,
) -> jax.Array:
    """Reduces a ``[B, T]`` per-token loss to a scalar.

    Args:
      loss_tok: ``[B, T] f32`` per-token loss (any value where ``keep`` is false; it is
        replaced by 0 with ``where``).
      keep: ``[B, T] bool`` tokens that enter the sum (a subset of ``loss_mask``).
      loss_mask: ``[B, T] bool`` response tokens (sequence lengths ``|o_i|``).
      num_loss_tokens: ``[] f32`` normaliser of ``token_mean``.
      mode: one of `AGGREGATIONS`.
      l_norm: constant of ``seq_mean_token_sum_norm`` (None: ``T``).

    Returns:
      ``[] f32`` loss.
    """
    lt = jnp.where(keep, loss_tok, 0.0)
    if mode == "token_mean":
        return jnp.sum(lt) / jnp.maximum(num_loss_tokens, 1.0)
    if mode == "token_mean_kept":
        return jnp.sum(lt) / jnp.maximum(jnp.sum(keep, dtype=jnp.float32), 1.0)
    seq_len_B = jnp.sum(loss_mask, axis=1, dtype=jnp.float32)
    num_seq = jnp.maximum(jnp.sum(seq_len_B > 0, dtype=jnp.float32), 1.0)
    if mode == "seq_mean_token_mean":
        return jnp.sum(jnp.sum(lt, axis=1) / jnp.maximum(seq_len_B, 1.0)) / num_seq
    if mode == "seq_mean_token_sum_norm":
        norm = float(loss_tok.shape[1]) if l_norm is None else float(l_norm)
        return jnp.sum(lt) / (num_seq * norm)
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
      l_norm: constant ``L_norm`` of ``seq_mean_token_sum_norm``; None means the padded
        width ``T`` of the batch.
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
