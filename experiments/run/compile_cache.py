"""The persistent JAX compilation cache of the command line (`experiments.run.cli`).

``entr-run`` keeps the XLA executables it compiles in the user cache, so a second run of
the same configuration (another seed, a resume, an override that leaves the shapes alone)
loads them instead of compiling again: ``$ENTR_JAX_CACHE`` names the folder, else the
platform cache folder (`platformdirs`; on Linux ``~/.cache/entr-jax/jax``);
``ENTR_JAX_CACHE=0`` (or ``off``) turns it off, and a folder already configured for JAX
(``JAX_COMPILATION_CACHE_DIR``) is kept. JAX keys every entry by the program, the compile
options, the devices and the jax/jaxlib versions, and stores only compilations that took
at least ``jax_persistent_cache_min_compile_time_secs`` (1 s by default). A run reports
its hits as ``time/counts/compile_cache_hits`` (`experiments.run.phases`).
"""

from __future__ import annotations

import os
from typing import Mapping

import jax

ENV = "ENTR_JAX_CACHE"
_OFF = {"0", "off", "false", "no"}

__all__ = ["ENV", "enable"]


def enable(environ: Mapping[str, str] = os.environ) -> str | None:
    """Point JAX's persistent compilation cache at the folder described in the module
    docstring (before the first compilation); returns the folder, or None when off."""
    value = environ.get(ENV, "").strip()
    if value.lower() in _OFF:
        return None
    configured = jax.config.jax_compilation_cache_dir
    if configured:
        return configured
    if not value:
        import platformdirs

        value = str(platformdirs.user_cache_path("entr-jax") / "jax")
    jax.config.update("jax_compilation_cache_dir", value)
    return value
