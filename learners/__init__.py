"""learners package of entr-jax: what updates parameters.

Modules: `state` (TrainState pytree, shardings), `batching` (Trajectory list -> Batch),
`optim` (clip + AdamW + schedule), `step` (jitted sharded RL/SFT steps, log-probs),
`checkpoint` (orbax manager with fallback), `logging` (tensorboardX + JSONL, deferred
metrics), `distributed` (multi-host init, global batch placement), `learner` (the host
API tying them together, with the non-finite guard).
"""
