"""Configuration of the SGLang fleet client (`samplers.sglang_fleet.SGLangFleet`).

One frozen dataclass, validated in ``__post_init__`` with errors that name the field
(``docs/design.md``, "Configs"). The meaning of every field is documented once,
here; ``docs/sglang.md`` explains how the pieces fit together.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable
from urllib.parse import urlparse

ExportFn = Callable[[Any, str], None]
"""``export_fn(params, path)``: write HF-format safetensors + config for ``params`` to the
directory ``path`` (created by the caller). The default is ``entr_jax.model.save_pretrained``,
whose first argument is the ``Decoder`` model itself: with the default, `update_weights`
must be given the model; a learner holding a bare parameter state passes its own
``export_fn`` that merges the state into a model first. SGLang's
``/update_weights_from_disk`` reloads weights only (the tokenizer of the launch stays)."""


@dataclasses.dataclass(frozen=True)
class SGLangFleetConfig:
    """How to reach, load-balance and update a fleet of SGLang servers.

    Attributes:
      server_urls: base URLs of the SGLang workers (``http://127.0.0.1:30000``), one per
        server process. Weight pushes, pause/continue and the version check always go to
        each of them directly; without ``router_url`` the client also routes ``/generate``
        among them.
      router_url: base URL of an ``sglang-router`` in front of ``server_urls``, or None.
        When set, every ``/generate`` goes through the router (its load balancing, health
        checks and retries), and the client adds/removes workers in the router's registry
        so that a worker that missed a weight push rejoins only after catching up
        (`samplers.sglang_router`, ``docs/sglang.md``). The router must route to no worker
        outside ``server_urls``.
      api_key: sent as ``Authorization: Bearer <api_key>`` on every request when set
        (servers launched with ``--api-key``).
      vocab_size: size V of the model's output vocabulary (``lm_head`` rows). Used only by
        the top-k entropy estimator for the tail bound (`sglang_entropy`).
      entropy_top_k: k, the number of top log-probs requested per generated token
        (``top_logprobs_num``) to estimate the full-vocabulary entropy when the server does
        not return it. ``>= 1`` and ``< vocab_size``.
      request_timeout_s: read/write timeout of one ``/generate`` call, seconds. A server
        that takes longer is treated as hung: the unit is retried elsewhere.
      connect_timeout_s: TCP connect timeout, seconds.
      control_timeout_s: timeout of control calls (pause, continue, weight update, health),
        seconds. Weight loading of a large model can take minutes: size this accordingly.
      max_attempts: attempts per request segment (first try + retries) before
        `generate` raises; each retry may go to another server.
      backoff_initial_s, backoff_max_s: exponential backoff between attempts
        (``tenacity.wait_exponential``), seconds.
      unhealthy_after: consecutive failures after which a server is taken out of rotation.
      reprobe_interval_s: how long an unhealthy server stays out before it is re-probed
        with ``/health_generate`` (and, if it missed a weight update, updated first).
      max_concurrency: worker threads, i.e. the maximum number of ``/generate`` requests in
        flight across the whole fleet.
      max_resumes: how many times one sample may be resumed after ``finish_reason`` =
        ``abort`` (the tokens so far are appended to the input and the remaining budget is
        requested). When exhausted, the `Generation` ends with ``finish_reason="abort"``.
      initial_version: integer policy version reported for SGLang's startup
        ``weight_version`` (the string ``"default"``) before any `update_weights`.
      send_sampling_seed: send ``sampling_seed`` (derived per prompt and sample from
        ``SamplingParams.seed``) in ``sampling_params``. SGLang honours it only when the
        server runs with ``--enable-deterministic-inference``.
      export_dir: directory under which `update_weights` writes ``v{version}/`` HF
        checkpoints. Every server must see this path (same host or shared filesystem).
      keep_exports: how many exported versions to keep on disk (older ones are deleted).
      export_fn: see `ExportFn`; None means ``entr_jax.model.save_pretrained`` (imported
        lazily on first use).
    """

    server_urls: tuple[str, ...] = ("http://127.0.0.1:30000",)
    router_url: str | None = None
    api_key: str | None = None
    vocab_size: int = 151_936
    entropy_top_k: int = 20
    request_timeout_s: float = 600.0
    connect_timeout_s: float = 5.0
    control_timeout_s: float = 600.0
    max_attempts: int = 6
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0
    unhealthy_after: int = 2
    reprobe_interval_s: float = 30.0
    max_concurrency: int = 64
    max_resumes: int = 8
    initial_version: int = 0
    send_sampling_seed: bool = True
    export_dir: str = "/tmp/entr_sglang_weights"
    keep_exports: int = 2
    export_fn: ExportFn | None = None

    def __post_init__(self):
        if isinstance(self.server_urls, (str, bytes)) or len(self.server_urls) == 0:
            raise ValueError(
                "SGLangFleetConfig.server_urls must be a non-empty tuple of URLs, got "
                f"{self.server_urls!r}"
            )
        object.__setattr__(self, "server_urls", tuple(u.rstrip("/") for u in self.server_urls))
        for url in self.server_urls:
            parsed = urlparse(url)
            if parsed.scheme not in ("http", "https") or not parsed.hostname:
                raise ValueError(
                    f"SGLangFleetConfig.server_urls entries must be http(s)://host:port URLs, "
                    f"got {url!r}"
                )
        if len(set(self.server_urls)) != len(self.server_urls):
            raise ValueError(f"SGLangFleetConfig.server_urls has duplicates: {self.server_urls}")
        if self.router_url is not None:
            router = self.router_url.rstrip("/")
            parsed = urlparse(router)
            if parsed.scheme not in ("http", "https") or not parsed.hostname:
                raise ValueError(
                    f"SGLangFleetConfig.router_url must be None or an http(s)://host:port URL, "
                    f"got {self.router_url!r}")
            if router in self.server_urls:
                raise ValueError(
                    f"SGLangFleetConfig.router_url {router!r} is also in server_urls: list the "
                    "workers in server_urls and the router only in router_url")
            object.__setattr__(self, "router_url", router)
        if self.api_key is not None and (not self.api_key or any(c.isspace() for c in self.api_key)):
            raise ValueError("SGLangFleetConfig.api_key must be None or a non-empty token without spaces")
        if self.vocab_size < 2:
            raise ValueError(f"SGLangFleetConfig.vocab_size must be >= 2, got {self.vocab_size}")
        if not 1 <= self.entropy_top_k < self.vocab_size:
            raise ValueError(
                f"SGLangFleetConfig.entropy_top_k must be in [1, vocab_size={self.vocab_size}), "
                f"got {self.entropy_top_k}"
            )
        for name in ("request_timeout_s", "connect_timeout_s", "control_timeout_s",
                     "backoff_initial_s", "backoff_max_s", "reprobe_interval_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"SGLangFleetConfig.{name} must be > 0, got {getattr(self, name)}")
        if self.backoff_max_s < self.backoff_initial_s:
            raise ValueError(
                f"SGLangFleetConfig.backoff_max_s ({self.backoff_max_s}) must be >= "
                f"backoff_initial_s ({self.backoff_initial_s})"
            )
        for name in ("max_attempts", "unhealthy_after", "max_concurrency", "keep_exports"):
            if getattr(self, name) < 1:
                raise ValueError(f"SGLangFleetConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_resumes < 0:
            raise ValueError(f"SGLangFleetConfig.max_resumes must be >= 0, got {self.max_resumes}")
        if self.initial_version < 0:
            raise ValueError(
                f"SGLangFleetConfig.initial_version must be >= 0, got {self.initial_version}"
            )
        if not self.export_dir:
            raise ValueError("SGLangFleetConfig.export_dir must be a non-empty path")
        if self.export_fn is not None and not callable(self.export_fn):
            raise ValueError("SGLangFleetConfig.export_fn must be callable(params, path) or None")
