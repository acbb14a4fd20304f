"""Test setup: 8 fake CPU devices (set before jax is imported) and strict rank promotion."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("ENTR_JAX_CACHE", "0")  # entr-run's compilation cache: not in tests

import jax  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
