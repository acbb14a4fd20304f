"""Policy-gradient objectives: ENTR (the method) and the off-policy baselines.

Specification: ``docs/algorithms.md`` sections 2-5 and 7.

Every objective is a pure function ``fn(logp_pi, batch, cfg) -> (loss, metrics)`` with a
frozen config dataclass; `OBJECTIVES` maps a method name to ``(fn, ConfigClass)`` and
`make_objective` binds a config::

    objective = make_objective("entr", tau=1.0, eps=0.01, clip_low=0.2, clip_high=0.28)
    loss, metrics = objective(logp_pi, batch)

``logp_pi`` is ``[B, T]`` float (cast to f32); ``batch`` is an
`entr_jax.types.ObjectiveInput` (the learner builds one per microbatch; shapes and dtypes
in its docstring), read only through the attributes ``logp_mu``, ``entropy_mu``, ``logp_prox``, ``logp_ref``, ``advantages``,
``loss_mask``, the optimizer-batch normalisers ``num_loss_tokens`` and ``num_sequences``
and ``batch_stats`` (plus ``entropy_pi`` for ENTR's ``current_full``), optional ones via
``getattr(batch, name, None)``. ``loss`` is a f32 scalar to minimise; ``metrics`` a flat
dict of f32 scalars with slash keys, each with a declared rule for pooling it over the
optimizer updates of one rollout batch (`METRIC_POOLING`, `entr_jax.objectives.pooling`). Gates are exported as pure functions returning
boolean keep-masks (`entr_mask`, `icepop_mask`, `kpop_mask`, `m2po_mask`, `trm_mask`) and
SAT's contraction factors (`sat_clip_factors`).

Exact gradient accumulation (`aggregation`): a loss is ``sum_{i,t} w l / D`` with ``D`` a
normaliser of the whole optimizer batch. The policy-independent normalisers
(``num_loss_tokens``, ``num_sequences``) are counted by the learner before the microbatch
loop; statistics of the current policy over the whole optimizer batch (M2PO's mask, SAT's
quantile, the kept-token count of ``token_mean_kept``) come from `BATCH_STATS`: the
learner evaluates ``BATCH_STATS[name](logp_pi, batch, cfg)`` on the whole optimizer batch
and hands each microbatch ``batch.batch_stats`` (``[B, ...]`` entries sliced to its rows).
Without them an objective computes everything on the batch it is given, which is the same
value when that is the whole batch.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax

from entr_jax.objectives.aggregation import AGGREGATIONS, ObjectiveConfig, aggregate
from entr_jax.objectives.decoupled import DecoupledPpoConfig, TisConfig, decoupled_ppo, decoupled_ppo_batch_stats, tis
from entr_jax.objectives.entr import EntrConfig, entr, entr_batch_stats
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
from entr_jax.objectives.masked_is import IcePopConfig, KPopConfig, icepop, icepop_batch_stats, kpop, kpop_batch_stats
from entr_jax.objectives.pooling import METRIC_POOLING
from entr_jax.objectives.reinforce import CispoConfig, M2poConfig, cispo, m2po, m2po_batch_stats
from entr_jax.objectives.sat import SatConfig, sat, sat_batch_stats
from entr_jax.objectives.sequence import (
    VESPO_ZERO_WEIGHT, GspoConfig, TrmConfig, VespoConfig, gspo, trm, trm_batch_stats, vespo, vespo_kernel,
)

ALIASES: dict[str, str] = {"estr": "entr"}
"""Other names of a registry method (ESTR is the paper's published name of ENTR): the
same function, config class and batch statistics; declared here only."""


def _with_aliases(table: dict[str, Any]) -> dict[str, Any]:
    """``table`` with each alias of `ALIASES` right after the name it stands for."""
    out = {}
    for name, entry in table.items():
        out[name] = entry
        out.update({alias: entry for alias, target in ALIASES.items() if target == name})
    return out


OBJECTIVES: dict[str, tuple[Callable, type[ObjectiveConfig]]] = _with_aliases({
    "entr": (entr, EntrConfig),
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
})


BatchStats = Callable[[jax.Array, Any, ObjectiveConfig], dict[str, jax.Array]]

BATCH_STATS: dict[str, BatchStats] = _with_aliases({
    "entr": entr_batch_stats,
    "decoupled_ppo": decoupled_ppo_batch_stats,
    "icepop": icepop_batch_stats,
    "kpop": kpop_batch_stats,
    "m2po": m2po_batch_stats,
    "trm": trm_batch_stats,
    "sat": sat_batch_stats,
})
"""Statistics of the current policy over the whole optimizer batch, for the objectives whose
config says ``uses_batch_stats()``: ``fn(logp_pi, batch, cfg) -> dict`` of ``[] f32``
scalars or ``[B, ...]`` per-row arrays (see the module docstring)."""


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


@dataclasses.dataclass(frozen=True)
class Objective:
    """A configured objective: ``objective(logp_pi, batch) -> (loss, metrics)``, pure and
    jit-compatible (the config is static).

    Attributes:
      name: the registry name (`OBJECTIVES`).
      config: the method's validated config (its class in `OBJECTIVES`).
      fn: the loss ``fn(logp_pi, batch, config)``.
      inputs: the optional batch fields it reads (``config.inputs()``: ``logp_prox``,
        ``logp_ref``, ``entropy_mu``...).
      batch_stats: ``batch_stats(logp_pi, batch) -> dict`` over the whole optimizer batch
        (its `BATCH_STATS` entry bound to the config) when ``config.uses_batch_stats()``,
        else None.
      metric_pooling: how its extra metric keys pool over microbatches and processes
        (``{key: rule}``, `entr_jax.objectives.pooling`); None: the defaults.
    """

    name: str
    config: Any
    fn: Callable[[jax.Array, Any, Any], tuple[jax.Array, dict[str, jax.Array]]]
    inputs: frozenset[str] = frozenset()
    batch_stats: Callable[[jax.Array, Any], dict[str, jax.Array]] | None = None
    metric_pooling: dict[str, str] | None = None

    def __call__(self, logp_pi: jax.Array, batch: Any) -> tuple[jax.Array, dict[str, jax.Array]]:
        return self.fn(logp_pi, batch, self.config)


def make_objective(name: str, config: ObjectiveConfig | None = None, **overrides: Any) -> Objective:
    """The `Objective` of method ``name``, with ``config`` (a built config of the
    method's class, e.g. a run's ``objective.<name>`` section) or the defaults with
    ``overrides`` (`make_config`).

    Raises:
      ValueError: see `make_config`; ``config`` together with overrides; ``config`` not of
        the method's config class.
    """
    if config is None:
        cfg = make_config(name, **overrides)
    elif overrides:
        raise ValueError(f"make_objective({name!r}): give a config or overrides, not both")
    elif name not in OBJECTIVES or type(config) is not OBJECTIVES[name][1]:
        want = OBJECTIVES[name][1].__name__ if name in OBJECTIVES else "a registry config"
        raise ValueError(f"make_objective({name!r}): config must be {want}, "
                         f"got {type(config).__name__}")
    else:
        cfg = config
    stats = (functools.partial(_bound_stats, BATCH_STATS[name], cfg)
             if cfg.uses_batch_stats() else None)
    return Objective(name=name, config=cfg, fn=OBJECTIVES[name][0], inputs=cfg.inputs(),
                     batch_stats=stats)


def _bound_stats(stats_fn: BatchStats, cfg: ObjectiveConfig, logp_pi: jax.Array,
                 batch: Any) -> dict[str, jax.Array]:
    return stats_fn(logp_pi, batch, cfg)


__all__ = [
    "AGGREGATIONS", "ALIASES", "BATCH_STATS", "METRIC_POOLING", "OBJECTIVES", "Objective", "VESPO_ZERO_WEIGHT", "ObjectiveConfig", "aggregate", "make_config", "make_objective",
    "entr", "EntrConfig", "grpo", "GrpoConfig", "decoupled_ppo", "DecoupledPpoConfig", "tis", "TisConfig",
    "icepop", "IcePopConfig", "kpop", "KPopConfig", "gspo", "GspoConfig", "cispo", "CispoConfig",
    "m2po", "M2poConfig", "trm", "TrmConfig", "vespo", "VespoConfig", "sat", "SatConfig",
    "entr_mask", "entr_score", "icepop_mask", "kpop_mask", "binary_kl", "m2po_mask", "trm_mask",
    "sat_clip_factors", "sat_quantile", "k3_kl", "vespo_kernel",
]
