"""The model's weight matmuls, with a backward pass whose weight gradient contracts 2-D
operands.

``matmul(x, w, w_contract)`` is ``lax.dot_general`` of ``x [..., K]`` with a 2-D weight
``w`` over ``x``'s last axis and ``w``'s axis ``w_contract`` (0 for a ``[K, N]`` kernel,
1 for a ``[V, D]`` embedding used as the unembedding), and its gradients are the ones
JAX's own transpose rule of ``dot_general`` gives, term for term:

* ``dx = g . w`` over ``g``'s last axis and ``w``'s other axis;
* ``dw = sum over every leading position of g[..., n] x[..., k]``.

The one difference is the shape ``dw`` is computed in. JAX contracts ``g [B, L, N]`` with
``x [B, L, K]`` over the two axes ``(0, 1)`` at once; XLA:CPU then lays that dot out by
materialising a transposed copy of the larger operand (for the MLP's ``gate``/``up``
projections, the ``[B * L, 4D]`` cotangent written column by column inside the SiLU
backward fusion; its cost: docs/performance.md). Here both operands are first flattened to 2-D
``[B * L, N]`` and ``[B * L, K]`` (a free reshape of row-major arrays), which XLA
contracts without that copy. The products summed are the same; only the order of the
float additions may differ, so the gradients agree with the plain ``dot_general`` to
float rounding (tests/test_matmul.py), and the forward value is the same ``dot_general``,
bit for bit.

Source: the transpose rule of ``dot_general`` (``jax._src.lax.lax._dot_general_transpose_lhs``
/ ``_rhs``); the chain rule for ``y = x W``: ``dL/dx = dL/dy W^T``, ``dL/dW = x^T dL/dy``.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
from jax import lax

__all__ = ["matmul", "dense_dot_general"]


@partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def matmul(x: jax.Array, w: jax.Array, w_contract: int, precision: Any = None,
           preferred_element_type: Any = None) -> jax.Array:
    """``x [..., K]`` contracted with the 2-D ``w`` over ``w``'s axis ``w_contract``.

    Args:
      x: ``[..., K]`` activations (any float dtype; ``x.ndim >= 1``).
      w: ``[K, N]`` (``w_contract=0``) or ``[N, K]`` (``w_contract=1``) weight.
      w_contract: 0 or 1 (static).
      precision, preferred_element_type: as in ``lax.dot_general`` (static).
    Returns:
      ``[..., N]``: exactly ``lax.dot_general(x, w, (((x.ndim - 1,), (w_contract,)),
      ((), ())), precision=..., preferred_element_type=...)``.
    Raises:
      ValueError: ``w`` not 2-D, ``w_contract`` not 0 or 1, or mismatched ``K``.
    """
    return _forward(x, w, w_contract, precision, preferred_element_type)


def _forward(x, w, w_contract, precision, preferred_element_type):
    if w.ndim != 2 or w_contract not in (0, 1):
        raise ValueError(f"matmul: w must be 2-D and w_contract 0 or 1, got w.shape {w.shape}, "
                         f"w_contract {w_contract!r}")
    if x.ndim < 1 or x.shape[-1] != w.shape[w_contract]:
        raise ValueError(f"matmul: x's last axis ({x.shape}) must match w's axis {w_contract} "
                         f"({w.shape})")
    return lax.dot_general(x, w, (((x.ndim - 1,), (w_contract,)), ((), ())),
                           precision=precision, preferred_element_type=preferred_element_type)


def _matmul_fwd(x, w, w_contract, precision, preferred_element_type):
    return _forward(x, w, w_contract, precision, preferred_element_type), (x, w)


def _matmul_bwd(w_contract, precision, preferred_element_type, res, g):
    x, w = res
    dx = lax.dot_general(g, w, (((g.ndim - 1,), (1 - w_contract,)), ((), ())),
                         precision=precision, preferred_element_type=preferred_element_type)
    g2 = g.reshape(-1, g.shape[-1])
    x2 = x.reshape(-1, x.shape[-1])
    dw_nk = lax.dot_general(g2, x2, (((0,), (0,)), ((), ())), precision=precision,
                            preferred_element_type=preferred_element_type)  # [N, K]
    dw = dw_nk.T if w_contract == 0 else dw_nk
    return dx.astype(x.dtype), dw.astype(w.dtype)


matmul.defvjp(_matmul_fwd, _matmul_bwd)


def dense_dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None,
                      out_sharding=None):
    """A ``dot_general`` for ``nnx.Linear(..., dot_general=dense_dot_general)``.

    The Linear layer's product (``lhs [..., K]`` with a 2-D kernel ``rhs [K, N]`` over
    ``K``, no batch axes, no ``out_sharding``) goes through `matmul`; any other call is
    plain ``lax.dot_general``. Arguments and result as in ``lax.dot_general``.
    """
    (lc, rc), (lb, rb) = dimension_numbers
    if (rhs.ndim == 2 and tuple(rc) == (0,) and tuple(lc) == (lhs.ndim - 1,) and not lb
            and not rb and out_sharding is None):
        return matmul(lhs, rhs, 0, precision, preferred_element_type)
    return lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                           preferred_element_type=preferred_element_type,
                           out_sharding=out_sharding)
