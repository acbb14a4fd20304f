"""The SGLang fleet as a run uses it: its configuration built from `RunConfig`, and the
counters a run logs.

The API key is read here, when the fleet is built, from where ``sampler.api_key`` says
(``env:NAME`` or ``file:PATH``; `samplers.sglang_config.read_api_key`): the run's
configuration only ever holds that reference.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from experiments.config import RunConfig
from experiments.errors import ConfigError
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


def fleet_metrics(sampler: Any) -> dict[str, float]:
    """The fleet's ``sglang/*`` values (`samplers.sglang_fleet.SGLangFleet.metrics`: its
    cumulative counters of retries, failovers, timeouts, refusals, outages, servers and
    router taken out and back, failed weight pushes, dropped, invalid and masked tokens;
    and the servers out of rotation now) for a run's metrics line; empty for a sampler
    without ``metrics`` (the embedded one)."""
    metrics = getattr(sampler, "metrics", None)
    if not callable(metrics):
        return {}
    return {k: float(v) for k, v in metrics().items() if k.startswith("sglang/")}
