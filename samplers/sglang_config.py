"""Configuration of the SGLang fleet client (`samplers.sglang_fleet.SGLangFleet`).

Frozen dataclasses, validated in ``__post_init__`` with errors that name the field
(``docs/design.md``, "Configs"). The meaning of every field is documented once, here;
``docs/sglang.md`` explains how the pieces fit together. `FleetPolicy` holds the timeouts,
the retry policy and the health rules (the run configuration exposes it as
``sampler.fleet``); `SGLangFleetConfig` adds where the fleet is and what it serves.

API keys are never configuration values: a configuration names where the key is read
from (`read_api_key`), so that what is stored (``config.json``, checkpoints, TensorBoard,
W&B) and what is shown (command lines, logs) never holds the key itself.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Callable, ClassVar
from urllib.parse import urlparse

ExportFn = Callable[[Any, str], None]
"""``export_fn(params, path)``: write HF-format safetensors + config for ``params`` to the
directory ``path`` (created by the caller). The default is ``entr_jax.model.save_pretrained``,
whose first argument is the ``Decoder`` model itself: with the default, `update_weights`
must be given the model; a learner holding a bare parameter state passes its own
``export_fn`` that merges the state into a model first. SGLang's
``/update_weights_from_disk`` reloads weights only (the tokenizer of the launch stays)."""

RelaunchFn = Callable[[str, str, int], None]
"""``relaunch(url, model_path, version)``: restart the server at ``url`` (one the caller
started itself, e.g. `samplers.sglang_procs.LocalServers.relaunch`) serving the HF
checkpoint ``model_path`` with ``weight_version`` ``str(version)``, and return once it
answers; raise if it cannot. The fleet calls it when a weight reload killed that server."""

API_KEY_SOURCES = ("env:", "file:")


def check_api_key_source(source: str, field: str) -> None:
    """Refuse anything but an empty string, ``env:NAME`` or ``file:PATH``.

    Raises:
      ValueError: naming ``field``; the value itself is never repeated (it may be a key).
    """
    if not source:
        return
    kind, _, rest = source.partition(":")
    if f"{kind}:" not in API_KEY_SOURCES or not rest.strip():
        raise ValueError(
            f"{field} must say where the API key is read from, env:NAME (an environment "
            "variable) or file:PATH (a file holding the key), e.g. `export SGLANG_API_KEY=...` "
            f"and {field}=env:SGLANG_API_KEY; it is not the key itself (a key given as a value "
            "would be stored in config.json and checkpoints and be visible on command lines). "
            "The value given is not repeated here")


def read_api_key(source: str, field: str) -> str | None:
    """The API key named by ``source`` (`check_api_key_source`): the value of environment
    variable ``NAME`` for ``env:NAME``, the first line of file ``PATH`` for ``file:PATH``
    (surrounding whitespace removed); None for an empty ``source``.

    Raises:
      ValueError: a bad ``source``, an unset or empty variable, a missing, unreadable or
        empty file, or a key with whitespace inside; the message names ``field`` and the
        variable or file, never the key.
    """
    check_api_key_source(source, field)
    if not source:
        return None
    kind, _, where = source.partition(":")
    if kind == "env":
        key = os.environ.get(where, "").strip()
        if not key:
            raise ValueError(f"{field}=env:{where}, but the environment variable {where} is "
                             f"not set or empty: export {where}=<the key> before starting")
    else:
        try:
            with open(os.path.expanduser(where), encoding="utf-8") as f:
                key = f.readline().strip()
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"{field}=file:{where}: cannot read the key file "
                             f"({getattr(e, 'strerror', None) or type(e).__name__})") from None
        if not key:
            raise ValueError(f"{field}=file:{where}: the key file is empty (its first line "
                             "must hold the key)")
    if any(c.isspace() for c in key):
        raise ValueError(f"{field}={source}: the key read from it contains whitespace")
    return key


@dataclasses.dataclass(frozen=True)
class FleetPolicy:
    """Timeouts, retries and health rules of the fleet client.

    A failed request is tried again (each try maybe on another server, with exponential
    backoff between them); a server failing ``unhealthy_after`` tries in a row leaves the
    rotation and is re-probed every ``reprobe_interval_s``. While no server is in
    rotation, requests wait (one warning line says so) up to ``outage_wait_s`` for one to
    come back; neither the wait nor a failure that took a server out counts against
    ``max_attempts``, so the fleet outlasts outages shorter than ``outage_wait_s``, which
    must exceed ``reprobe_interval_s``.

    Attributes:
      request_timeout_s: fixed part of the time one ``/generate`` call may take, seconds.
      request_timeout_per_token_s: added per token of the call's budget
        (``max_new_tokens``), seconds: a call may take ``request_timeout_s +
        request_timeout_per_token_s * max_new_tokens`` before its server is treated as
        hung (the call is aborted and retried elsewhere). 0 = the fixed part only.
      connect_timeout_s: TCP connect timeout, seconds.
      control_timeout_s: timeout of control calls (pause, continue, weight update, health,
        the router's registry), seconds. Weight loading of a large model can take
        minutes: size this accordingly.
      max_attempts: failed tries of one request segment after which `generate` raises.
        A try whose failure takes its server out of rotation does not count (the health
        rules deal with that server, and the request waits for one to come back), nor does
        waiting; so an outage is waited out, not retried away.
      backoff_initial_s: exponential backoff between tries
        (``tenacity.wait_exponential``), seconds.
      backoff_max_s: exponential backoff between tries
        (``tenacity.wait_exponential``), seconds.
      unhealthy_after: consecutive failures after which a server (or the router) is
        taken out of rotation.
      reprobe_interval_s: how long a server out of rotation stays out before it is
        re-probed (and, if it missed a weight update, updated first), seconds.
      outage_wait_s: how long a request waits while no server is in rotation before
        `generate` raises naming each server's last error, seconds (> reprobe_interval_s).
    """

    FIELD_PREFIX: ClassVar[str] = "FleetPolicy."

    request_timeout_s: float = 60.0
    request_timeout_per_token_s: float = 0.1
    connect_timeout_s: float = 5.0
    control_timeout_s: float = 600.0
    max_attempts: int = 6
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0
    unhealthy_after: int = 2
    reprobe_interval_s: float = 30.0
    outage_wait_s: float = 900.0

    def __post_init__(self):
        name = lambda f: self.FIELD_PREFIX + f  # noqa: E731
        for f in ("request_timeout_s", "connect_timeout_s", "control_timeout_s",
                  "backoff_initial_s", "backoff_max_s", "reprobe_interval_s", "outage_wait_s"):
            value = getattr(self, f)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or not value > 0:
                raise ValueError(f"{name(f)} must be a finite number > 0, got {value!r}")
        per_token = self.request_timeout_per_token_s
        if not (isinstance(per_token, (int, float)) and math.isfinite(per_token)
                and per_token >= 0):
            raise ValueError(f"{name('request_timeout_per_token_s')} must be a finite number "
                             f">= 0, got {per_token!r}")
        if self.backoff_max_s < self.backoff_initial_s:
            raise ValueError(f"{name('backoff_max_s')} ({self.backoff_max_s}) must be >= "
                             f"{name('backoff_initial_s')} ({self.backoff_initial_s})")
        for f in ("max_attempts", "unhealthy_after"):
            if isinstance(getattr(self, f), bool) or not isinstance(getattr(self, f), int) \
                    or getattr(self, f) < 1:
                raise ValueError(f"{name(f)} must be an int >= 1, got {getattr(self, f)!r}")
        if not self.outage_wait_s > self.reprobe_interval_s:
            raise ValueError(
                f"{name('outage_wait_s')} ({self.outage_wait_s}) must exceed "
                f"{name('reprobe_interval_s')} ({self.reprobe_interval_s}): requests must wait "
                "long enough for a server out of rotation to be probed again")

    def request_timeout(self, max_new_tokens: int) -> float:
        """Seconds one ``/generate`` call with this budget may take (see the attributes)."""
        return self.request_timeout_s + self.request_timeout_per_token_s * max(0, max_new_tokens)


@dataclasses.dataclass(frozen=True)
class SGLangFleetConfig(FleetPolicy):
    """How to reach, load-balance and update a fleet of SGLang servers (the timeouts,
    retries and health rules are `FleetPolicy`'s fields).

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
        outside ``server_urls``. While the router is out of rotation (it failed
        ``unhealthy_after`` times in a row), requests go to the workers directly.
      api_key: the key itself, sent as ``Authorization: Bearer <api_key>`` on every request
        when set (servers launched with ``--api-key``); read it with `read_api_key`. It is
        left out of the config's ``repr``.
      vocab_size: size V of the model's output vocabulary (``lm_head`` rows): token ids of
        a reply must lie in ``[0, V)``; also the tail size of the top-k entropy bound
        (`sglang_entropy`).
      entropy_top_k: k, the number of top log-probs requested per generated token
        (``top_logprobs_num``) to estimate the full-vocabulary entropy when the server does
        not return it. ``>= 1`` and ``< vocab_size``.
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
      relaunch: see `RelaunchFn`; None (servers the caller did not start) = a server killed
        by a reload is waited for like any server out of rotation.
    """

    FIELD_PREFIX: ClassVar[str] = "SGLangFleetConfig."

    server_urls: tuple[str, ...] = ("http://127.0.0.1:30000",)
    router_url: str | None = None
    api_key: str | None = dataclasses.field(default=None, repr=False)
    vocab_size: int = 151_936
    entropy_top_k: int = 20
    max_concurrency: int = 64
    max_resumes: int = 8
    initial_version: int = 0
    send_sampling_seed: bool = True
    export_dir: str = "/tmp/entr_sglang_weights"
    keep_exports: int = 2
    export_fn: ExportFn | None = None
    relaunch: RelaunchFn | None = None

    def __post_init__(self):
        super().__post_init__()
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
            raise ValueError("SGLangFleetConfig.api_key must be None or a non-empty token without "
                             "spaces (the value given is not repeated here)")
        if self.vocab_size < 2:
            raise ValueError(f"SGLangFleetConfig.vocab_size must be >= 2, got {self.vocab_size}")
        if not 1 <= self.entropy_top_k < self.vocab_size:
            raise ValueError(
                f"SGLangFleetConfig.entropy_top_k must be in [1, vocab_size={self.vocab_size}), "
                f"got {self.entropy_top_k}"
            )
        for name in ("max_concurrency", "keep_exports"):
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
        if self.relaunch is not None and not callable(self.relaunch):
            raise ValueError("SGLangFleetConfig.relaunch must be callable(url, model_path, "
                             "version) or None")
