"""learners package of entr-jax: what updates parameters.

Modules: `config` (`LearnerOptions`, the knobs a run sets, and `LearnerConfig`), `state`
(TrainState pytree, shardings), `batching` (Trajectory list -> Batch), `optim` (clip +
AdamW + schedule), `step` (jitted sharded RL/SFT steps over a rollout batch: mini-batches
x epochs, log-probs), `accumulate` (exact gradient accumulation over microbatches),
`diagnostics` (per-token metrics and their reduction over a rollout batch), `contract`
(what the learner refuses to score), `checkpoint` (orbax manager with fallback),
`logging` (tensorboardX + JSONL, deferred metrics), `distributed` (multi-host init,
global batch placement), `learner` (the host API tying them together, with the
non-finite guard).
"""
