"""The weighted PPO surrogate shared by decoupled PPO, TIS, IcePop and KPop."""

from __future__ import annotations

import jax

from entr_jax.objectives import common as c


def weighted_ppo(inp: c.Inputs, logp_prox: jax.Array, w: jax.Array, keep: jax.Array, cfg,
                 num_kept: jax.Array | None = None) -> tuple[jax.Array, c.Metrics]:
    """``loss = agg(-sg(w) * min(u A, clip(u, 1 - clip_low, 1 + clip_high) A))`` over ``keep``.

    ``u = exp(clip(logp_pi - logp_prox))``; ``w`` is a ``[B, T]`` detached weight; ``cfg``
    has ``clip_low``, ``clip_high``, ``mode``, ``l_norm``; ``num_kept`` is the kept-token
    count of the optimizer batch (`common.kept_count`; None when ``keep`` is ``loss_mask``).
    Rejected tokens have their inputs replaced before any arithmetic. Returns
    ``(loss, metrics)`` with the base metrics plus ``is_weight/mean`` and ``is_weight/max``
    over kept tokens.
    """
    lp, lprox, adv, w = c.gate(keep, inp.logp_pi, logp_prox, inp.advantages, w)
    u = c.ratio(lp, lprox)
    loss_tok, lo, hi = c.ppo_clip_loss(u, adv, 1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    loss = c.agg(inp, c.sg(w) * loss_tok, keep, cfg, num_kept)
    metrics = {**c.pg_metrics(inp, loss, cfg, num_kept), **c.base_metrics(inp, keep, lo, hi)}
    metrics["is_weight/mean"] = c.masked_mean(w, keep)
    metrics["is_weight/max"] = c.masked_max(w, keep)
    return loss, c.f32_metrics(metrics)
