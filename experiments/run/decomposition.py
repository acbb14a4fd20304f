"""Scoring every sampled token with the learner at the token's own version.

Each token carries the version ``v_t`` of the weights that produced it
(``token_version``). Scoring the token with the *learner* at that version,
``logp_version = log pi_{theta_{v_t}}(o_t | context)``, splits the log importance ratio
exactly (docs/decomposition.md):

    delta = logp_pi - logp_mu
          = (logp_version - logp_mu)   delta_mis: train-inference mismatch
          + (logp_pi - logp_version)   delta_stale: policy drift since v_t

``logp_version`` is computed when the batch is generated, when every version it used is
still in the parameter ring (`entr_jax.staleness.ParamRing`): one scoring pass per
distinct version in the batch, through the learner's own log-prob program
(`learners.learner.Learner.token_logprobs`), so equal weights give bitwise equal
log-probs and at lag 0 ``delta_stale`` is exactly 0.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from entr_jax.staleness import ParamRing
from entr_jax.types import Trajectory


def logp_at_token_version(learner: Any, trajectories: Sequence[Trajectory],
                          ring: ParamRing, versions: Sequence[int]) -> np.ndarray:
    """``[B, T] float32`` (``B = len(trajectories)``, ``T`` the learner's target length for
    these trajectories, the layout of `Learner.token_logprobs`): the learner's log-prob of
    each sampled token under the weights of its own ``token_version``, 0 off the loss mask.

    Args:
      learner: a `learners.learner.Learner` (its ``token_logprobs`` is a collective with
        several processes, so every process passes the same ``versions``).
      trajectories: the batch's trajectories (this process's rows).
      ring: holds the weights of every version in ``versions``.
      versions: the versions the batch was generated with (the staleness plan's, the same
        on every process); one scoring pass each.

    Raises:
      ValueError: a loss token's version is not in ``versions`` (it names both).
      KeyError: a version is not in ``ring`` (the message names the versions it holds).
    """
    used = {int(v) for t in trajectories
            for v in np.asarray(t.token_version)[np.asarray(t.loss_mask, bool)]}
    if not used <= set(versions):
        raise ValueError(f"tokens of versions {sorted(used - set(versions))} are not among "
                         f"the batch's generation versions {list(versions)}")
    out: np.ndarray | None = None
    for v in versions:
        scored = learner.token_logprobs(trajectories, weights=ring.get(v))
        if out is None:
            out = np.zeros(scored["logp_pi"].shape, np.float32)
        take = scored["loss_mask"].astype(bool) & (scored["token_version"] == v)
        out[take] = scored["logp_pi"][take]
    if out is None:
        raise ValueError("logp_at_token_version: no versions given")
    return out
