"""The SGLang fleet as a run uses it: its configuration built from `RunConfig` (the
counters a run logs are read by `experiments.run.sources.fleet_counters`).

The API key is read here, when the fleet is built, from where ``sampler.api_key`` says
(``env:NAME`` or ``file:PATH``; `samplers.sglang_config.read_api_key`): the run's
configuration only ever holds that reference.
"""

from __future__ import annotations

import dataclasses

from experiments.run.config import RunConfig
from experiments.run.errors import ConfigError
from samplers.sglang_config import ExportFn, FleetPolicy, SGLangFleetConfig, read_api_key


def fleet_config(cfg: RunConfig, *, vocab_size: int, export_dir: str,
                 export_fn: ExportFn) -> SGLangFleetConfig:
    """The `SGLangFleetConfig` of a run with ``sampler.kind=sglang``: its servers, router,
    key, and ``sampler.fleet``'s timeouts, retries and health rules.

    Raises:
      ConfigError: the key named by ``sampler.api_key`` cannot be read (naming the
        variable or file, never the key).
    """
    s = cfg.sampler
    try:
        api_key = read_api_key(s.api_key, "sampler.api_key")
    except ValueError as err:
        raise ConfigError(str(err)) from None
    policy = {f.name: getattr(s.fleet, f.name) for f in dataclasses.fields(FleetPolicy)}
    return SGLangFleetConfig(**policy, server_urls=s.server_urls, router_url=s.router_url or None,
                             api_key=api_key, vocab_size=vocab_size, export_dir=export_dir,
                             export_fn=export_fn)
