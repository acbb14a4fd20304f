"""Rollout batches: their metrics, their sampling seeds, and (de)serialisation for
checkpoints. They are made by the rollout sources (`experiments.run.sources`)."""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from entr_jax import staleness as st
from entr_jax.types import Trajectory

_TRAJ_ARRAYS = {
    "prompt_ids": np.int32, "response_ids": np.int32, "logp_mu": np.float32,
    "entropy_mu": np.float32, "token_version": np.int32, "loss_mask": bool,
}


@dataclasses.dataclass
class RolloutBatch:
    """One learner batch worth of trajectories (P prompts x G samples).

    Attributes:
      batch_id: the learner step ``n`` that consumes it (also the data position).
      generation_version: learner version when it was generated (the newest version used;
        async mode: the newest token version in the batch).
      trajectories: P*G trajectories, example-major.
      sample_s: wall seconds spent generating it.
      first_version: the version decoding started with (simulated mode: ``g - D``; async
        mode: the oldest token version); None when unknown (older checkpoints).
      entropy_estimated_tokens: generated tokens whose ``entropy_mu`` is a top-k estimate
        rather than exact (`entropy_estimated_count`; 0 for the embedded sampler).
      logp_version: ``[len(trajectories), T] float32``, the learner's log-prob of each
        sampled token at the token's own version (`experiments.run.decomposition`), in the
        layout of `learners.learner.Learner.token_logprobs`; None when not computed.
    """

    batch_id: int
    generation_version: int
    trajectories: list[Trajectory]
    sample_s: float = 0.0
    first_version: int | None = None
    entropy_estimated_tokens: int = 0
    logp_version: np.ndarray | None = None

    def to_json(self) -> dict[str, Any]:
        trajs = []
        for t in self.trajectories:
            d = {k: np.asarray(getattr(t, k)).tolist() for k in _TRAJ_ARRAYS}
            d.update(reward=float(t.reward), group_id=int(t.group_id),
                     finish_reason=t.finish_reason, info=_plain(t.info))
            trajs.append(d)
        return {"batch_id": self.batch_id, "generation_version": self.generation_version,
                "sample_s": self.sample_s, "first_version": self.first_version,
                "entropy_estimated_tokens": self.entropy_estimated_tokens,
                "logp_version": (None if self.logp_version is None
                                 else np.asarray(self.logp_version, np.float32).tolist()),
                "trajectories": trajs}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "RolloutBatch":
        trajs = [
            Trajectory(**{k: np.asarray(t[k], dtype) for k, dtype in _TRAJ_ARRAYS.items()},
                       reward=t["reward"], group_id=t["group_id"],
                       finish_reason=t["finish_reason"], info=t["info"])
            for t in d["trajectories"]
        ]
        logp_version = d.get("logp_version")
        return cls(d["batch_id"], d["generation_version"], trajs, d["sample_s"],
                   d.get("first_version"), int(d.get("entropy_estimated_tokens", 0)),
                   None if logp_version is None else np.asarray(logp_version, np.float32))


def _plain(obj: Any) -> Any:
    """JSON-safe copy of a trajectory's info dict."""
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, (np.integer, np.floating, np.bool_)):
        return obj.item()
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    return str(obj)


def sampling_seed(seed: int, batch_id: int, stream: int = 0, offset: int = 0) -> int:
    """Sampling seed of one rollout batch, or of one process's share of it: a function of
    (run seed, batch id, stream, offset) only.

    ``stream`` 0 is for training rollouts, other streams for evaluation; ``offset`` is the
    index of the share's first prompt in the global batch (`experiments.run.multiprocess`).
    Offset 0 (one process, or process 0) gives the single-process seed, so a one-process
    run's rollouts do not depend on this argument; other offsets give other streams.
    """
    key = [seed, 11, stream, batch_id] + ([offset] if offset else [])
    return int(np.random.default_rng(key).integers(0, 2**31 - 1))


def entropy_estimated_count(sampler: Any) -> int:
    """Cumulative count of generated tokens whose ``entropy_mu`` is a top-k estimate: the
    SGLang fleet's ``metrics()["sglang/tokens_entropy_estimated"]``; 0 for samplers that
    report exact entropies (the embedded `JaxSampler` has no ``metrics``). The difference
    across one batch's generation is that batch's count."""
    metrics = getattr(sampler, "metrics", None)
    if not callable(metrics):
        return 0
    return int(metrics().get("sglang/tokens_entropy_estimated", 0))


def is_correct(traj: Trajectory) -> bool:
    """Whether an episode was answered correctly: the environment's ``correct`` flag, or a
    reward of at least 1 for environments that give none."""
    return bool(traj.info.get("correct", traj.reward >= 1.0))


def trajectory_stats(trajectories: Sequence[Trajectory], version: int,
                     entropy_estimated_tokens: int = 0) -> dict[str, list]:
    """Per-trajectory numbers behind `rollout_metrics` (JSON-able lists, one entry per
    trajectory): ``reward``, ``length`` (policy tokens), ``correct``, ``truncated``,
    ``group`` (``group_id``), ``inter`` and ``intra`` staleness at learner ``version``;
    and ``entropy_estimated``, a one-entry list with ``entropy_estimated_tokens`` (this
    share's count). Lists of several processes concatenate into the stats of their union
    (`experiments.run.multiprocess`): group ids are global, counts add up."""
    stale = [st.trajectory_staleness(version, t.token_version, t.loss_mask) for t in trajectories]
    return {
        "reward": [float(t.reward) for t in trajectories],
        "length": [int(np.sum(t.loss_mask)) for t in trajectories],
        "correct": [is_correct(t) for t in trajectories],
        "truncated": [bool(t.info.get("truncated")) for t in trajectories],
        "group": [int(t.group_id) for t in trajectories],
        "inter": [int(s[0]) for s in stale],
        "intra": [int(s[1]) for s in stale],
        "entropy_estimated": [int(entropy_estimated_tokens)],
    }


def metrics_from_stats(batch_id: int, generation_version: int, stats: dict[str, list],
                       version: int, first_version: int | None = None) -> dict[str, Any]:
    """`rollout_metrics` from `trajectory_stats` (of one batch, or of the union of every
    process's rows of it) consumed at learner ``version``; ``first_version``: the version
    the batch's generation started from (None: unknown, no ``staleness/intra_planned``)."""
    rewards = np.array(stats["reward"], np.float64)
    lengths = np.array(stats["length"])
    inter, intra = np.array(stats["inter"]), np.array(stats["intra"])
    has_tokens = lengths > 0
    inter_planned = version - generation_version
    unrealised = np.where(has_tokens, inter - inter_planned, 0)
    planned = {}
    if first_version is not None:
        planned["staleness/intra_planned"] = int(generation_version - first_version)
    groups: dict[int, list[float]] = {}
    for g, r in zip(stats["group"], rewards):
        groups.setdefault(int(g), []).append(float(r))
    flat = [max(g) == min(g) for g in groups.values()]
    estimated = int(sum(stats["entropy_estimated"]))
    return {
        "batch/id": batch_id,
        "batch/generation_version": generation_version,
        "reward/mean": float(rewards.mean()),
        "reward/std": float(rewards.std()),
        "reward/correct_frac": float(np.mean(stats["correct"])),
        "reward/zero_variance_group_frac": float(np.mean(flat)),
        "response/length_mean": float(lengths.mean()),
        "response/length_max": int(lengths.max()),
        "response/truncated_frac": float(np.mean(stats["truncated"])),
        "staleness/inter_mean": float(inter.mean()),
        "staleness/inter_max": int(inter.max()),
        "staleness/intra_mean": float(intra.mean()),
        "staleness/intra_max": int(intra.max()),
        "staleness/inter_hist": np.bincount(inter).tolist(),
        "staleness/intra_hist": np.bincount(intra).tolist(),
        "staleness/inter_planned": int(inter_planned),
        **planned,
        "staleness/total_mean": float((inter + intra)[has_tokens].mean()) if has_tokens.any() else 0.0,
        "staleness/unrealised_switches": int(unrealised.sum()),
        "staleness/all_switches_frac": float(np.mean(unrealised[has_tokens] == 0))
        if has_tokens.any() else 1.0,
        "sampler/entropy_estimated_tokens": estimated,
        "sampler/entropy_estimated_frac": min(1.0, estimated / max(int(lengths.sum()), 1)),
    }


def rollout_metrics(batch: RolloutBatch, version: int) -> dict[str, Any]:
    """Deterministic metrics of a rollout batch consumed at learner ``version``.

    Keys: ``batch/id``, ``batch/generation_version``, ``reward/mean``, ``reward/std``,
    ``reward/correct_frac``, ``reward/zero_variance_group_frac`` (fraction of the prompt
    groups, by ``group_id``, whose rewards are all equal: with group-normalised advantages
    they carry no gradient), ``response/length_mean`` and ``/length_max`` (policy tokens),
    ``response/truncated_frac``, ``staleness/inter_mean``, ``/inter_max``,
    ``/intra_mean``, ``/intra_max`` (per trajectory, ESTR section 2),
    ``staleness/inter_hist`` / ``intra_hist`` (counts of trajectories per value 0..max);
    what the staleness plan realised (`entr_jax.staleness` module docstring):
    ``staleness/inter_planned`` (``version - generation_version``, the age of the batch's
    newest weights), ``staleness/intra_planned`` (``generation_version - first_version``,
    the switches planned; absent when ``first_version`` is unknown),
    ``staleness/total_mean`` (mean of inter + intra, equal to the sum of the two planned
    values in simulated mode), ``staleness/unrealised_switches`` (sum over trajectories of
    ``generation_version - v_last``: switches a trajectory ended before) and
    ``staleness/all_switches_frac`` (trajectories that realised every switch); and the
    entropy provenance ``sampler/entropy_estimated_tokens`` (generated tokens whose
    ``entropy_mu`` is a top-k estimate, counting any later cut by ``max_total_tokens``) and
    ``sampler/entropy_estimated_frac`` (that count over the policy tokens, at most 1; 0 =
    every ``entropy_mu`` exact).
    """
    return metrics_from_stats(batch.batch_id, batch.generation_version,
                              trajectory_stats(batch.trajectories, version,
                                               batch.entropy_estimated_tokens),
                              version, first_version=batch.first_version)
