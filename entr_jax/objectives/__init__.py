"""Policy-gradient objectives: ENTR (the method) and the off-policy baselines.

Specification: ``docs/algorithms.md`` sections 2-5 and 7.

Every objective is a pure function ``fn(logp_pi, batch, cfg) -> (loss, metrics)`` with a
frozen config dataclass; `OBJECTIVES` maps a method name to ``(fn, ConfigClass)`` and
`make_objective` binds a config::

    objective = make_objective("entr", tau=1.0, eps=0.01, clip_low=0.2, clip_high=0.28)
    loss, metrics = objective(logp_pi, batch)

``logp_pi`` is ``[B, T]`` float (cast to f32); ``batch`` is read only through the
attributes ``logp_mu``, ``entropy_mu``, ``logp_prox``, ``logp_ref``, ``advantages``,
``loss_mask`` and ``num_loss_tokens`` (plus ``entropy_pi`` for ENTR's ``current_full``),
optional ones via ``getattr(batch, name, None)``. ``loss`` is a f32 scalar to minimise;
``metrics`` a flat dict of f32 scalars with slash keys. Gates are exported as pure
functions returning boolean keep-masks (`entr_mask`, `icepop_mask`, `kpop_mask`,
`m2po_mask`, `trm_mask`) and SAT's contraction factors (`sat_clip_factors`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax

from entr_jax.objectives.aggregation import AGGREGATIONS, ObjectiveConfig, aggregate
from entr_jax.objectives.decoupled import DecoupledPpoConfig, TisConfig, decoupled_ppo, tis
from entr_jax.objectives.entr import EntrConfig, entr
from entr_jax.objectives.gates import (
    binary_kl,
    entr_mask,
    entr_score,
    icepop_mask,
    kpop_mask,
    m2po_mask,
    sat_clip_factors,
    sat_quantile,
    trm_mask,
)
from entr_jax.objectives.grpo import GrpoConfig, grpo, k3_kl
from entr_jax.objectives.masked_is import IcePopConfig, KPopConfig, icepop, kpop
from entr_jax.objectives.reinforce import CispoConfig, M2poConfig, cispo, m2po
from entr_jax.objectives.sat import SatConfig, sat
from entr_jax.objectives.sequence import GspoConfig, TrmConfig, VespoConfig, gspo, trm, vespo, vespo_kernel

Objective = Callable[[jax.Array, Any], tuple[jax.Array, dict[str, jax.Array]]]

OBJECTIVES: dict[str, tuple[Callable, type[ObjectiveConfig]]] = {
    "entr": (entr, EntrConfig),
    "estr": (entr, EntrConfig),  # the paper's published name
    "grpo": (grpo, GrpoConfig),
    "decoupled_ppo": (decoupled_ppo, DecoupledPpoConfig),
    "tis": (tis, TisConfig),
    "icepop": (icepop, IcePopConfig),
    "kpop": (kpop, KPopConfig),
    "gspo": (gspo, GspoConfig),
    "cispo": (cispo, CispoConfig),
    "m2po": (m2po, M2poConfig),
    "trm": (trm, TrmConfig),
    "vespo": (vespo, VespoConfig),
    "sat": (sat, SatConfig),
}


def make_config(name: str, **overrides: Any) -> ObjectiveConfig:
    """Builds the validated config of objective ``name`` with ``overrides``.

    Raises:
      ValueError: unknown objective name (lists the known ones), unknown field (lists the
        valid ones) or an invalid value (names the field).
    """
    if name not in OBJECTIVES:
        raise ValueError(f"unknown objective {name!r}; known objectives: {sorted(OBJECTIVES)}")
    cls = OBJECTIVES[name][1]
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(f"{cls.__name__} has no field(s) {unknown}; valid fields: {sorted(fields)}")
    return cls(**overrides)


def make_objective(name: str, **overrides: Any) -> Objective:
    """Returns ``objective(logp_pi, batch) -> (loss, metrics)`` for method ``name``.

    The returned callable is pure and jit-compatible; the config is closed over (static)
    and exposed as ``objective.config``, the method name as ``objective.name``.

    Raises:
      ValueError: see `make_config`.
    """
    cfg = make_config(name, **overrides)
    fn = OBJECTIVES[name][0]

    def objective(logp_pi: jax.Array, batch: Any):
        return fn(logp_pi, batch, cfg)

    objective.config = cfg
    objective.name = name
    objective.__name__ = f"{name}_objective"
    objective.__doc__ = fn.__doc__
    return objective


__all__ = [
    "AGGREGATIONS", "OBJECTIVES", "Objective", "ObjectiveConfig", "aggregate", "make_config", "make_objective",
    "entr", "EntrConfig", "grpo", "GrpoConfig", "decoupled_ppo", "DecoupledPpoConfig", "tis", "TisConfig",
    "icepop", "IcePopConfig", "kpop", "KPopConfig", "gspo", "GspoConfig", "cispo", "CispoConfig",
    "m2po", "M2poConfig", "trm", "TrmConfig", "vespo", "VespoConfig", "sat", "SatConfig",
    "entr_mask", "entr_score", "icepop_mask", "kpop_mask", "binary_kl", "m2po_mask", "trm_mask",
    "sat_clip_factors", "sat_quantile", "k3_kl", "vespo_kernel",
]
