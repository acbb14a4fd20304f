"""experiments package of entr-jax."""
