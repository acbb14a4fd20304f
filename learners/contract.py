"""What the learner refuses to score, checked before any step: trajectories sampled from
another distribution than the one it scores (`check_behavior`), token ids the model cannot
embed (`check_token_ids`), and a KL penalty to the reference under sampling filters
(`check_reference_filters`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from entr_jax.sampling_filter import filter_active
from entr_jax.types import Trajectory

if TYPE_CHECKING:
    from learners.learner import LearnerConfig


def check_reference_filters(objective: Callable | None, config: "LearnerConfig") -> None:
    """Refuse a KL penalty to the reference policy under sampling filters.

    With ``top_k``/``top_p``/``min_p`` on, ``logp_ref`` is scored under the reference's
    *filtered* distribution (the same ``logprob_fn`` as ``logp_pi``), so a sampled token
    outside the reference's kept set gets ``LOGP_OUTSIDE_KEPT = -1e4``
    (`entr_jax.logprobs`) instead of its true ``-inf``: GRPO's k3 term (DeepSeekMath eq. 4)
    then clips ``logp_ref - logp_pi`` to -20 and adds the constant 19.0 with zero gradient,
    i.e. no penalty exactly where pi left the reference's support. KL(pi || ref) between
    truncated policies is not defined there, so the combination is refused.

    Raises:
      ValueError: ``"logp_ref" in objective.inputs`` and a filter is on; names the fields.
    """
    if "logp_ref" not in getattr(objective, "inputs", frozenset()):
        return
    if not filter_active(config.top_k, config.top_p, config.min_p):
        return
    on = ", ".join(f"LearnerConfig.{name}={getattr(config, name)!r}"
                   for name, off in (("top_k", -1), ("top_p", 1.0), ("min_p", 0.0))
                   if getattr(config, name) != off)
    name = getattr(objective, "name", "the objective")
    raise ValueError(
        f"{name} reads logp_ref (a k3 KL penalty to the reference policy, e.g. "
        f"GrpoConfig.kl_coef > 0), but sampling filters are on ({on}): a sampled token "
        "outside the reference's filtered (truncated) support gets the stand-in log-prob "
        "-1e4, so the KL term is a clipped constant with no gradient exactly where pi left "
        "that support. Set kl_coef=0 or turn the filters off (top_k=-1, top_p=1.0, "
        "min_p=0.0)")


def check_behavior(trajectories: Sequence[Trajectory], config: "LearnerConfig") -> None:
    """Refuse trajectories drawn from another distribution than the learner scores.

    Each trajectory that records its `entr_jax.types.BehaviorParams` must have been
    sampled with the learner's ``temperature``, ``top_k``, ``top_p`` and ``min_p``:
    otherwise ``logp_pi`` would be the log-prob under another distribution than the one
    ``logp_mu`` describes, and on-policy ratios would differ from 1 with no staleness at
    all. Trajectories without a record (``behavior`` None) are not checked.

    Raises:
      ValueError: naming the first mismatching trajectory, both settings and the fix.
    """
    want = (float(config.temperature), int(config.top_k), float(config.top_p),
            float(config.min_p))
    for i, traj in enumerate(trajectories):
        b = getattr(traj, "behavior", None)
        if b is None:
            continue
        got = (float(b.temperature), int(b.top_k), float(b.top_p), float(b.min_p))
        if got != want:
            names = ("temperature", "top_k", "top_p", "min_p")
            sampled = ", ".join(f"{n}={v!r}" for n, v in zip(names, got))
            scored = ", ".join(f"{n}={v!r}" for n, v in zip(names, want))
            raise ValueError(
                f"trajectories[{i}] was sampled with {sampled}, but the learner scores "
                f"{scored}: logp_pi would not be the distribution logp_mu describes. Build "
                f"the Learner with LearnerConfig({sampled}), the sampler's settings")


def check_token_ids(trajectories: Sequence[Trajectory], vocab_size: int | None) -> None:
    """Refuse token ids outside ``[0, vocab_size)``: the embedding lookup of such an id is
    NaN, so the step would be skipped as non-finite instead of failing (None: no check).

    Raises:
      ValueError: naming the trajectory, the id and the vocabulary size.
    """
    if vocab_size is None:
        return
    for i, traj in enumerate(trajectories):
        for name in ("prompt_ids", "response_ids"):
            ids = np.asarray(getattr(traj, name))
            bad = ids[(ids < 0) | (ids >= vocab_size)]
            if bad.size:
                raise ValueError(f"trajectories[{i}].{name} holds token id {int(bad[0])}, "
                                 f"outside the model's vocabulary [0, {vocab_size}): the "
                                 "sampler produced ids this model cannot embed")
