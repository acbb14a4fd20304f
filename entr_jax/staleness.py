"""Staleness: the seeded lag schedule, the delay line of rollout batches, the ring of
recent parameter versions, and the staleness measurements.

Definitions (ESTR, arXiv 2607.22186, section 2; ``docs/algorithms.md``):

* staleness of a token = learner ``version`` - ``token_version`` (the version of the
  weights that generated it);
* inter-trajectory staleness of a trajectory = target (learner) version - ``v_last``, the
  last version that generated any of its tokens;
* intra-trajectory staleness = ``v_last - v_first`` inside one trajectory.

Simulated mode (``docs/design.md``, "Data flow"):

* **Inter lag as a delay line.** Every learner step ``n`` consumes exactly one rollout
  batch, which was generated when the learner was at version
  ``g_n = max(0, n - k_n)``, with ``k_n`` drawn from the configured lag distribution by a
  key derived only from ``(seed, n)``. Before learner step ``v`` runs, the loop generates,
  with the *current* weights (version ``v``), every batch ``n`` in ``[v, v + K]`` with
  ``g_n == v`` and parks it until step ``n``. No parameter copies are needed. The batch's
  *newest* weights are exactly ``min(n, k_n)`` versions old at step ``n`` (``k_n`` once
  the first ``K`` warm-up steps have passed).
* **Intra switches from a ring.** A batch generated at version ``g`` starts decoding
  with version ``g - D_n``, ``D_n = min(intra_switches, g)``, and advances one version at
  each of ``D_n`` seeded decode steps ``s_1 < ... < s_D`` in ``[1, switch_window - 1]``
  (the same steps for every row of the batch; only the first turn of a multi-turn episode
  switches, later turns use ``g``), ending at ``g``; the versions come from a ring holding
  the last ``ring_size >= D + 1`` parameter versions.

What is guaranteed per trajectory (measured from its policy tokens' versions, consumed
at step ``n``, with ``k = min(n, k_n)`` and ``D = D_n``):

* its first token is made by ``v_first = g - D``; its last by ``v_last = g - u``, where
  ``u`` (its *unrealised* switches) is the number of switch steps its first turn did not
  reach (``s >= `` the first turn's length), or 0 when later turns of a multi-turn
  episode ran (they use ``g``). So **inter = k + u and intra = D - u**;
* hence **inter + intra = k + D exactly for every trajectory** (the age of its first
  token), and inter = k, intra = D exactly for every trajectory that realises all
  switches, e.g. any whose first turn is longer than ``s_D``, which holds for every
  first turn of at least ``switch_window`` tokens. A trajectory that stops early is
  *more* inter-stale and *less* intra-stale than configured, never more in total.

So ``inter_lag`` configures the lag of the batch's newest weights, and equals the
measured inter staleness only for trajectories that realise all switches. When every
first turn has at least ``switch_window`` tokens (choose ``switch_window`` at most the
shortest response length) measured == configured for both quantities. The loop reports what was
realised: ``staleness/unrealised_switches`` (sum of ``u`` over the batch) and
``staleness/all_switches_frac`` (`experiments.run.rollouts.rollout_metrics`).

Everything here is host-side numpy and deterministic in ``(seed, batch index)``, so a run
is reproducible bit for bit and resumable from `DelayLine.state_dict`.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, ClassVar, Generic, Literal, TypeVar

import numpy as np

Mode = Literal["sync", "simulated", "async"]
LagDistribution = Literal["fixed", "uniform", "geometric"]

_INTER_STREAM = 1


def _simulated(default: Any) -> Any:
    """A field only ``mode="simulated"`` reads (the seeded plan)."""
    return dataclasses.field(default=default, metadata={"variants": ("simulated",)})

_INTRA_STREAM = 2


@dataclasses.dataclass(frozen=True)
class StalenessConfig:
    """How stale the data the learner sees is, and how that staleness is produced.

    Attributes:
      mode: ``sync`` (lag 0, the on-policy baseline), ``simulated`` (seeded, reproducible
        lag) or ``async`` (sampling and learning overlap for real; staleness measured).
      inter_distribution: law of the inter-trajectory lag ``k_n`` in versions: ``fixed``
        (``k_n = inter_lag``), ``uniform`` (integer uniform on ``[inter_lag, max_inter_lag]``)
        or ``geometric`` (``inter_lag + Geometric(geometric_p)`` counted from 0, truncated
        to ``max_inter_lag`` and renormalised).
      inter_lag: the fixed lag, or the lower end of the random lag (>= 0): the age of the
        batch's newest weights; a trajectory's measured inter staleness equals it when the
        trajectory realises all intra switches, and exceeds it by the number it misses
        (module docstring).
      max_inter_lag: upper end ``K`` of a random lag (>= inter_lag); ignored when fixed.
      geometric_p: success probability of the geometric lag, in (0, 1].
      intra_switches: ``D``, the number of version switches planned inside one trajectory
        (>= 0); a trajectory whose first turn ends before switch step ``s`` does not
        realise that switch (measured intra = ``D`` minus the unrealised ones).
      switch_window: switches happen at distinct decode steps drawn uniformly from
        ``[1, switch_window - 1]``; needs ``intra_switches <= switch_window - 1``. A first
        turn of at least ``switch_window`` tokens realises every switch.
      ring_size: parameter versions kept for replaying intra switches; needs
        ``ring_size >= intra_switches + 1``.
      max_staleness: async mode only: the sampler waits when it is this many versions
        ahead of the learner (>= 0).
      seed: the lag schedule's own seed, in ``[0, 2**32)``.
    """

    # the field that selects a variant, and per field the variants that read it
    # (``metadata["variants"]``; none: every mode), checked by the run's command line
    VARIANT_FIELD: ClassVar[str] = "mode"

    mode: Mode = "simulated"
    inter_distribution: LagDistribution = _simulated("fixed")
    inter_lag: int = _simulated(1)
    max_inter_lag: int = _simulated(1)
    geometric_p: float = _simulated(0.5)
    intra_switches: int = _simulated(0)
    switch_window: int = _simulated(16)
    ring_size: int = 2
    max_staleness: int = dataclasses.field(default=4, metadata={"variants": ("async",)})
    seed: int = _simulated(0)

    def __post_init__(self):
        if self.mode not in ("sync", "simulated", "async"):
            raise ValueError(f"staleness.mode must be sync|simulated|async, got {self.mode!r}")
        if self.inter_distribution not in ("fixed", "uniform", "geometric"):
            raise ValueError(
                "staleness.inter_distribution must be fixed|uniform|geometric, got "
                f"{self.inter_distribution!r}"
            )
        _require(self.inter_lag >= 0, "inter_lag", self.inter_lag, ">= 0")
        _require(self.max_inter_lag >= 0, "max_inter_lag", self.max_inter_lag, ">= 0")
        _require(0 <= self.seed < 2**32, "seed", self.seed, "in [0, 2**32) (numpy's seeds)")
        if self.inter_distribution != "fixed":
            _require(
                self.max_inter_lag >= self.inter_lag,
                "max_inter_lag",
                self.max_inter_lag,
                f">= inter_lag ({self.inter_lag})",
            )
        _require(0 < self.geometric_p <= 1, "geometric_p", self.geometric_p, "in (0, 1]")
        _require(self.intra_switches >= 0, "intra_switches", self.intra_switches, ">= 0")
        _require(self.switch_window >= 2, "switch_window", self.switch_window, ">= 2")
        _require(
            self.intra_switches <= self.switch_window - 1,
            "intra_switches",
            self.intra_switches,
            f"<= switch_window - 1 ({self.switch_window - 1})",
        )
        _require(self.ring_size >= 1, "ring_size", self.ring_size,
                 ">= 1 (it keeps the versions the intra switches replay)")
        _require(
            self.ring_size >= self.intra_switches + 1,
            "intra_switches",
            self.intra_switches,
            f"<= ring_size - 1 ({self.ring_size - 1}): the parameter ring is too shallow",
        )
        _require(self.max_staleness >= 0, "max_staleness", self.max_staleness, ">= 0")

    @property
    def max_lag(self) -> int:
        """Largest inter lag the schedule can draw (0 in sync mode)."""
        if self.mode == "sync":
            return 0
        return self.inter_lag if self.inter_distribution == "fixed" else self.max_inter_lag


def _require(ok: bool, field: str, value: Any, what: str) -> None:
    if not ok:
        raise ValueError(f"staleness.{field} must be {what}, got {value!r}")


def _rng(seed: int, stream: int, index: int) -> np.random.Generator:
    return np.random.default_rng([seed, stream, index])


def inter_lag(cfg: StalenessConfig, n: int) -> int:
    """The configured inter-trajectory lag ``k_n`` of learner step ``n`` (before warm-up
    clamping). Depends only on ``(cfg, n)``."""
    if cfg.mode == "sync":
        return 0
    if cfg.inter_distribution == "fixed":
        return cfg.inter_lag
    rng = _rng(cfg.seed, _INTER_STREAM, n)
    if cfg.inter_distribution == "uniform":
        return int(rng.integers(cfg.inter_lag, cfg.max_inter_lag + 1))
    support = np.arange(cfg.max_inter_lag - cfg.inter_lag + 1)
    probs = cfg.geometric_p * (1.0 - cfg.geometric_p) ** support
    return cfg.inter_lag + int(rng.choice(support, p=probs / probs.sum()))


def generation_version(cfg: StalenessConfig, n: int) -> int:
    """Version ``g_n = max(0, n - k_n)`` at which the batch of learner step ``n`` is made."""
    return max(0, n - inter_lag(cfg, n))


def intra_plan(cfg: StalenessConfig, n: int) -> tuple[int, tuple[int, ...]]:
    """Intra-trajectory switch plan of batch ``n``.

    Returns ``(first_version, switch_steps)``: decoding starts with the weights of
    ``first_version = max(0, g_n - D)`` and moves one version forward at each decode step
    in ``switch_steps`` (sorted, distinct, in ``[1, switch_window - 1]``), so the last
    version is ``g_n`` for a row that reaches the last switch step (a row that stops
    earlier ends at an older version; module docstring). In sync mode there are no
    switches.
    """
    g = generation_version(cfg, n)
    d = 0 if cfg.mode == "sync" else min(cfg.intra_switches, g)
    if d == 0:
        return g, ()
    rng = _rng(cfg.seed, _INTRA_STREAM, n)
    steps = rng.choice(np.arange(1, cfg.switch_window), size=d, replace=False)
    return g - d, tuple(int(s) for s in np.sort(steps))


def planned_lag(cfg: StalenessConfig, n: int) -> tuple[int, int]:
    """``(inter, intra) = (n - g_n, D_n)``: the planned age of batch ``n``'s newest weights
    and its number of in-flight switches (what a trajectory realising every switch
    measures; module docstring). Equal to the configured ``(k_n, intra_switches)`` only
    from the step ``n >= k_n + intra_switches`` on: before it the delay line is not yet
    full (no version older than 0 exists), and every batch ``n <= k_n`` (for a fixed lag
    ``k``: the first ``k + 1``) is made by the starting weights."""
    g = generation_version(cfg, n)
    return n - g, (0 if cfg.mode == "sync" else min(cfg.intra_switches, g))


def full_lag_steps(cfg: StalenessConfig, steps: int) -> int | None:
    """How many of the learner steps ``0 .. steps - 1`` get the configured lag in full
    (`planned_lag` equal to ``(k_n, intra_switches)``) in simulated mode; ``steps`` in
    sync mode (lag 0 throughout); None in async mode (its lag is measured, not planned)."""
    if cfg.mode == "sync":
        return steps
    if cfg.mode != "simulated":
        return None
    # every step n >= max_lag + intra_switches gets it (`planned_lag`): count the head only
    head = min(steps, cfg.max_lag + cfg.intra_switches)
    return (sum(planned_lag(cfg, n) == (inter_lag(cfg, n), cfg.intra_switches)
                for n in range(head)) + steps - head)


class DelayLine:
    """Parks rollout batches generated ahead of the learner step that consumes them.

    Usage per learner version ``v``: ``for n in line.due(v): line.put(n, make_batch(n))``,
    then ``batch = line.pop(v)``. ``due`` lists, in increasing order, the batch indices
    whose generation version is ``v`` and that were not generated yet.
    """

    def __init__(self, cfg: StalenessConfig):
        self.cfg = cfg
        self._pending: dict[int, Any] = {}
        self._consumed = 0  # batches 0 .. _consumed - 1 were popped by the learner

    def due(self, version: int) -> list[int]:
        """Batch indices to generate now, with the weights of ``version``.

        ``g_n == version`` implies ``version <= n <= version + max_lag``, so the scan is
        bounded; batches already parked or consumed are never listed twice.
        """
        lo = max(version, self._consumed)
        return [
            n
            for n in range(lo, version + self.cfg.max_lag + 1)
            if n not in self._pending and generation_version(self.cfg, n) == version
        ]

    def put(self, n: int, batch: Any) -> None:
        if n in self._pending or n < self._consumed:
            raise ValueError(f"batch {n} was already generated")
        self._pending[n] = batch

    def pop(self, n: int) -> Any:
        """The batch of learner step ``n``; it must have been generated already."""
        if n not in self._pending:
            raise KeyError(
                f"batch {n} was never generated: call due()/put() for every version first"
            )
        self._consumed = max(self._consumed, n + 1)
        return self._pending.pop(n)

    def __len__(self) -> int:
        return len(self._pending)

    def state_dict(self) -> dict[str, Any]:
        """Contents and position, for checkpoints (batches are stored as given)."""
        return {"consumed": self._consumed, "pending": dict(self._pending)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._consumed = int(state["consumed"])
        self._pending = {int(k): v for k, v in state["pending"].items()}


T = TypeVar("T")


class ParamRing(Generic[T]):
    """A bounded ring of the most recent ``(version, params)`` pairs."""

    def __init__(self, size: int):
        if size < 1:
            raise ValueError(f"ParamRing size must be >= 1, got {size}")
        self._items: collections.OrderedDict[int, T] = collections.OrderedDict()
        self.size = size

    def push(self, version: int, params: T) -> None:
        if self._items and version <= next(reversed(self._items)):
            raise ValueError(
                f"versions must increase: got {version} after {next(reversed(self._items))}"
            )
        self._items[version] = params
        while len(self._items) > self.size:
            self._items.popitem(last=False)

    def get(self, version: int) -> T:
        if version not in self._items:
            raise KeyError(
                f"version {version} is not in the parameter ring (holds {list(self._items)})"
            )
        return self._items[version]

    @property
    def versions(self) -> list[int]:
        return list(self._items)


def trajectory_staleness(
    version: int, token_version: np.ndarray, loss_mask: np.ndarray
) -> tuple[int, int]:
    """``(inter, intra)`` staleness of one trajectory, from its policy tokens.

    Args:
      version: the learner version the trajectory is consumed at.
      token_version: ``[R] int`` version per response token.
      loss_mask: ``[R] bool``; only policy tokens (true) count.

    Returns ``inter = version - v_last`` and ``intra = v_last - v_first`` (ESTR section 2);
    ``(0, 0)`` for a trajectory without policy tokens.
    """
    v = np.asarray(token_version)[np.asarray(loss_mask, bool)]
    if v.size == 0:
        return 0, 0
    return int(version - v.max()), int(v.max() - v.min())
