"""learners package of entr-jax."""
