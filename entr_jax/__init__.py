"""entr-jax: asynchronous RL post-training of LLMs in JAX.

The library half of the project: objectives (ENTR and the off-policy baselines),
advantages, the policy model, log-probs, staleness arithmetic, tasks and the small
protocols (`Sampler`) through which `learners` and `samplers` meet.
Heavy optional dependencies (transformers, torch, HTTP clients) are imported lazily.
"""

__version__ = "0.1.0"
