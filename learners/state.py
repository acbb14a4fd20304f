"""The learner's train state: one pytree holding everything a step reads and writes.

The NNX module is split once into a static `nnx.GraphDef` (kept as pytree metadata, so it
never becomes a traced value) and `nnx.State`s of parameters (trained) and other
variables (buffers, kept as they are). The optax state, the policy ``version``, the step
counter and the RNG key travel with them so the whole thing can be donated to the jitted
step, sharded once and checkpointed.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct
from jax.sharding import Mesh

from entr_jax.sharding import replicated, state_shardings

__all__ = ["TrainState", "abstract_train_state", "check_params", "create_train_state",
           "make_state_init", "train_state_shardings"]


@struct.dataclass
class TrainState:
    """Learner state (a pytree; ``graphdef`` is static metadata).

    Attributes:
      graphdef: `nnx.GraphDef` of the policy module (static).
      params: `nnx.State` of the `nnx.Param` variables (the trained weights).
      other: `nnx.State` of every other variable of the module (buffers), not trained.
      opt_state: optax state of ``make_optimizer(...)`` over ``params``.
      version: ``[] int32`` policy version: the number of train-step calls (rollout
        batches) in which at least one optimizer update was applied, i.e. weight
        publications. Tokens sampled with these weights carry this version;
        ``staleness = version - token_version`` (in rollout batches). The number of
        optimizer updates is the optimizer's own ``count`` (it drives the schedule).
      step: ``[] int32`` number of step calls (applied or skipped).
      rng: ``[2] uint32`` raw PRNG key (``jax.random.PRNGKey`` layout), split by the step
        for anything stochastic and checkpointed with the state.
    """

    graphdef: nnx.GraphDef = struct.field(pytree_node=False)
    params: nnx.State
    other: nnx.State
    opt_state: optax.OptState
    version: jax.Array
    step: jax.Array
    rng: jax.Array

    def model(self) -> nnx.Module:
        """A fresh NNX module holding these parameters (for evaluation or publishing)."""
        return nnx.merge(self.graphdef, self.params, self.other)


def _split(module: nnx.Module):
    graphdef, params, other = nnx.split(module, nnx.Param, ...)
    return graphdef, params, other


def _build(module: nnx.Module, tx: optax.GradientTransformation, seed: int) -> TrainState:
    graphdef, params, other = _split(module)
    return TrainState(
        graphdef=graphdef,
        params=params,
        other=other,
        opt_state=tx.init(params),
        version=jnp.zeros((), jnp.int32),
        step=jnp.zeros((), jnp.int32),
        rng=jax.random.PRNGKey(seed),
    )


def abstract_train_state(
    module_fn: Callable[[], nnx.Module], tx: optax.GradientTransformation, seed: int = 0
) -> TrainState:
    """The train state as `jax.ShapeDtypeStruct`s (no memory), from a module constructor.

    ``module_fn`` builds the module (e.g. ``lambda: Decoder(cfg, rngs=nnx.Rngs(0), ...)``);
    it is only traced (``nnx.eval_shape``).
    """
    return jax.eval_shape(lambda: _build(module_fn(), tx, seed))


def train_state_shardings(abstract_state: TrainState, mesh: Mesh) -> TrainState:
    """`NamedSharding` for every leaf of ``abstract_state`` (built once, reused by every jit).

    Parameters and optimizer moments follow the parameters' logical axis names through
    ``LOGICAL_AXIS_RULES``; scalars, buffers without annotations and the RNG key are
    replicated.
    """
    rep = replicated(mesh)
    return abstract_state.replace(
        params=state_shardings(abstract_state.params, mesh),
        other=state_shardings(abstract_state.other, mesh),
        opt_state=state_shardings(abstract_state.opt_state, mesh),
        version=rep,
        step=rep,
        rng=rep,
    )


def check_params(abstract: nnx.State, params: nnx.State) -> None:
    """``params`` must have the parameter paths and shapes of ``abstract`` (arrays or
    shape structs).

    Raises:
      ValueError: a missing or unexpected parameter, or a shape that differs (named).
    """
    want = dict(nnx.to_flat_state(abstract))
    got = dict(nnx.to_flat_state(params))
    if set(want) != set(got):
        missing = sorted(".".join(map(str, p)) for p in set(want) - set(got))
        extra = sorted(".".join(map(str, p)) for p in set(got) - set(want))
        raise ValueError(f"initial params do not match the module: missing {missing[:4]}, "
                         f"unexpected {extra[:4]}")
    for path, var in want.items():
        shape, expected = _shape(got[path]), _shape(var)
        if shape != expected:
            raise ValueError(f"initial param {'.'.join(map(str, path))} has shape {shape}, "
                             f"the module's is {expected}")


def _shape(leaf) -> tuple[int, ...]:
    value = leaf.get_value() if hasattr(leaf, "get_value") else leaf
    return tuple(value.shape)


def make_state_init(
    module_fn: Callable[[], nnx.Module],
    tx: optax.GradientTransformation,
    mesh: Mesh,
    seed: int = 0,
) -> tuple[Callable[[], TrainState], TrainState]:
    """The jitted random initialisation of the train state and its shardings.

    The module is traced once for shapes (`abstract_train_state`); the returned
    ``init()`` builds it inside a jit whose ``out_shardings`` are the target shardings, so
    no device ever holds an unsharded copy of the parameters. ``init.lower().compile()``
    compiles it without running it (`benchmarks/compile.py`).

    Returns:
      ``(init, shardings)``: a zero-argument jitted function returning the `TrainState`,
      and the matching tree of `NamedSharding`s.
    """
    shardings = train_state_shardings(abstract_train_state(module_fn, tx, seed), mesh)
    return jax.jit(lambda: _build(module_fn(), tx, seed), out_shardings=shardings), shardings


def create_train_state(
    module_fn: Callable[[], nnx.Module],
    tx: optax.GradientTransformation,
    mesh: Mesh,
    seed: int = 0,
    params: nnx.State | None = None,
) -> tuple[TrainState, TrainState]:
    """Initialise the train state directly in its shardings.

    The module is built inside a jit whose ``out_shardings`` are the target shardings, so
    no device ever holds an unsharded copy of the parameters.

    Args:
      params: initial weights (the `nnx.Param` state of ``module_fn``'s module, e.g. read
        from a checkpoint), used instead of the random initialisation, which is then never
        materialised (XLA drops it); cast to the module's parameter dtypes and placed into
        the parameter shardings. The caller's arrays are donated when they already are in
        those shardings and dtypes (do not use them afterwards). None: random init.

    Returns:
      ``(state, shardings)``: the state and the matching tree of `NamedSharding`s.

    Raises:
      ValueError: ``params`` lacks a parameter of the module, has an extra one, or a shape
        differs (the message names it).
    """
    if params is None:
        init, shardings = make_state_init(module_fn, tx, mesh, seed)
        return init(), shardings
    abstract = abstract_train_state(module_fn, tx, seed)
    shardings = train_state_shardings(abstract, mesh)
    check_params(abstract.params, params)
    params = jax.device_put(params, shardings.params)

    def build(initial):
        graphdef, _, other = _split(module_fn())  # its random params are dead code
        initial = jax.tree.map(lambda x, a: x.astype(a.dtype), initial, abstract.params)
        return TrainState(graphdef=graphdef, params=initial, other=other,
                          opt_state=tx.init(initial), version=jnp.zeros((), jnp.int32),
                          step=jnp.zeros((), jnp.int32), rng=jax.random.PRNGKey(seed))

    state = jax.jit(build, out_shardings=shardings, donate_argnums=0)(params)
    return state, shardings
