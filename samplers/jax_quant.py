"""Weight-only quantisation of the embedded sampler: a deterministic, context-dependent
train-inference mismatch with the structure of a real engine's.

Inference engines often serve linear layers with quantised weights (W8A16 int8, FP8
e4m3, W4A16 int4) while the learner trains in float32/bfloat16. The sampler's logits then
differ from the learner's by a perturbation that is a fixed function of the weights and
the context: correlated across the vocabulary, the same on every draw, small in logit
units but amplified in ``delta = log pi - log mu`` where the sampled token is improbable
(ESTR, arXiv 2607.22186, Sec. 3.5). Unlike Gaussian logit noise (`samplers.jax_mismatch`),
it does not change from draw to draw and it moves every logit of a position together.

Each ``kernel`` (``[..., in, out]``: the attention q/k/v/o and MLP gate/up/down
projections, with any leading axes such as stacked layers) is quantised with qwix
(``qwix.quantize``: symmetric absmax scale per output channel, and per index of every
leading axis) and dequantised back; the sampler then computes in its compute dtype with these values,
which is what a W8A16 / FP8-weight / W4A16 kernel computes up to the order of its
accumulation. Embeddings (and a tied LM head), norms and biases stay as they are, as
engines keep them by default.
"""

from __future__ import annotations

import functools
from typing import Any, Literal

import jax
import jax.numpy as jnp

WeightQuant = Literal["none", "int8", "fp8", "int4"]
QTYPES = {"int8": jnp.int8, "fp8": jnp.float8_e4m3fn, "int4": jnp.int4}


def _is_kernel(path) -> bool:
    return any(getattr(k, "key", getattr(k, "name", None)) == "kernel" for k in path)


def quantize_weights(state: Any, scheme: WeightQuant) -> Any:
    """``state`` (an ``nnx.State`` or any pytree of a `Decoder`'s variables) with every
    ``kernel`` leaf ``[..., in, out]`` replaced by ``dequantize(quantize(kernel))`` in
    float32 (one scale per output channel and leading index, reduced over ``in``); other
    leaves unchanged. ``scheme="none"`` returns ``state`` itself. One compiled program per
    scheme and tree structure (the weights of every version reuse it).

    Raises:
      ValueError: an unknown ``scheme`` (the message lists the known ones).
    """
    if scheme == "none":
        return state
    if scheme not in QTYPES:
        raise ValueError(f"weight quantisation must be one of {['none', *QTYPES]}, got {scheme!r}")
    return _round_trip(state, scheme)


@functools.partial(jax.jit, static_argnames="scheme")
def _round_trip(state: Any, scheme: str) -> Any:
    import qwix

    qtype = QTYPES[scheme]

    def one(path, x):
        ndim = getattr(x, "ndim", 0)
        if not _is_kernel(path) or ndim < 2:
            return x
        q = qwix.quantize(jnp.asarray(x, jnp.float32), qtype,
                          channelwise_axes=tuple(i for i in range(ndim) if i != ndim - 2))
        return qwix.dequantize(q).astype(jnp.float32)

    return jax.tree_util.tree_map_with_path(one, state)
