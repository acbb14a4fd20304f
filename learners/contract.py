"""What the learner refuses to score, checked before any step: trajectories sampled from
another distribution than the one it scores (`check_behavior`), token ids the model cannot
embed (`check_token_ids`), and a KL penalty to the reference under sampling filters
(`check_reference_filters`)."""

from __future__ import annotations

from typing import Any, Callable, Collection, Mapping, Sequence

import numpy as np

from entr_jax.sampling_filter import filter_active
from entr_jax.types import Trajectory
from learners.config import LearnerConfig


FILTERS_OFF = (("top_p", 1.0), ("top_k", -1), ("min_p", 0.0))
"""The sampling filters and their "off" values, in the order messages name them."""


def check_reference_filters(inputs: Collection[str], filters: Mapping[str, Any], *, kl: str,
                            kl_off: str, field: Callable[[str, Any], str]) -> None:
    """Refuse a KL penalty to the reference policy under sampling filters.

    With ``top_k``/``top_p``/``min_p`` on, ``logp_ref`` is scored under the reference's
    *filtered* distribution (the same ``logprob_fn`` as ``logp_pi``), so a sampled token
    outside the reference's kept set gets ``LOGP_OUTSIDE_KEPT = -1e4``
    (`entr_jax.logprobs`) instead of its true ``-inf``: GRPO's k3 term (DeepSeekMath eq. 4)
    then clips ``logp_ref - logp_pi`` to -20 and adds the constant 19.0 with zero gradient,
    i.e. no penalty exactly where pi left the reference's support. KL(pi || ref) between
    truncated policies is not defined there, so the combination is refused. The run's
    configuration calls it when it is parsed (`experiments.run.config.RunConfig`), the
    `learners.learner.Learner` when it is built; each names the fields its caller sets.

    Args:
      inputs: the optional batch fields the objective reads (``objective.inputs``).
      filters: ``{"top_p": ..., "top_k": ..., "min_p": ...}``, the filters scored.
      kl: the setting that turns the penalty on, as the caller names it
        (``"--objective.grpo.kl_coef 0.04"``).
      kl_off: that setting turned off (``"--objective.grpo.kl_coef 0"``).
      field: ``field(name, value)`` names a filter setting (``"--sampling.top_p 0.9"``).

    Raises:
      ValueError: ``"logp_ref" in inputs`` and a filter is on; names the fields and fixes.
    """
    if "logp_ref" not in inputs:
        return
    if not filter_active(filters["top_k"], filters["top_p"], filters["min_p"]):
        return
    on = ", ".join(field(name, filters[name]) for name, off in FILTERS_OFF
                   if filters[name] != off)
    off = " ".join(field(name, value) for name, value in FILTERS_OFF)
    raise ValueError(
        f"{kl} (a k3 KL penalty to the reference policy) cannot be used with sampling "
        f"filters ({on}): the reference is then scored under its filtered distribution, a "
        "sampled token outside its kept set gets the stand-in log-prob -1e4 and the KL term "
        "is a clipped constant with no gradient exactly where the policy left the "
        f"reference's support. Set {kl_off} or turn the filters off ({off})")


def check_behavior(trajectories: Sequence[Trajectory], config: LearnerConfig) -> None:
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
