"""samplers package of entr-jax."""
