"""A `Sampler` over a fleet of SGLang servers, spoken to through their native HTTP API.

Every (prompt, sample) pair is one *unit*, sampled by one ``/generate`` request with
``n = 1`` (not one request with ``n = G``): a unit is then the grain of routing, retry and
failover, so a dead or hung server costs only its own units, each of which is answered
exactly once; SGLang's radix cache still shares the prompt prefix across the G samples.

What the client does, in full (routing with or without SGLang's router, retries with
backoff, refusals, outages, resumed aborts, the version of every token, weight sync by
pause / ``/update_weights_from_disk`` / continue): `docs/sglang.md`, section 3. In short:
requests go to the router while it is in rotation, else to the least busy worker in
rotation (`samplers.sglang_routing`); a failed try is retried (``tenacity``) up to
``max_attempts``; while no server is in rotation requests wait up to ``outage_wait_s``; an
aborted reply is resumed from its last token, each token keeping the version of the reply
that produced it; weight pushes go to every worker directly (`samplers.sglang_workers`).

Every reply is validated against its request and the model (token ids, log-probs,
counts, versions, entropies; `samplers.sglang_reply`); the entropy estimate with its error
bound is `samplers.sglang_entropy`. `SGLangFleet.metrics` counts every fault.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import re
import shutil
import threading
import uuid
import warnings
from typing import Any, Sequence

import httpx
import numpy as np
import tenacity

from entr_jax.interfaces import SamplingParams
from entr_jax.types import BehaviorParams, Generation
from samplers.sglang_config import SGLangFleetConfig
from samplers.sglang_protocol import (
    MalformedResponse,
    build_generate_payload,
    check_params_supported,
    decode_body,
)
from samplers.sglang_reply import COUNTER_KEYS, ReplyContext, Segment, parse_reply
from samplers.sglang_routing import FleetError, Retryable, WeightSyncError
from samplers.sglang_workers import Workers

COUNTERS = COUNTER_KEYS + (
    "tokens", "retries", "failovers", "timeouts", "connection_errors", "http_errors",
    "malformed_responses", "rejections", "aborts_resumed", "probes", "servers_recovered",
    "servers_marked_unhealthy", "outages", "outage_waits", "weight_updates",
    "weight_update_failures", "stale_replies", "version_checks", "router_removals",
    "router_additions", "router_errors", "router_marked_unhealthy", "router_recovered",
    "router_bypassed", "weight_sync_outages", "weight_sync_recovered", "weight_update_partial",
    "servers_relaunched", "relaunch_failures")
"""The cumulative counters of `SGLangFleet.metrics` (each as ``sglang/<name>``)."""

SERVER_LEVEL_REJECTIONS = (401, 403, 404, 405)
"""4xx answers that say the server (not the request) is wrong: a key it refuses, a route it
does not have (not an SGLang server). The server leaves the rotation."""


class SGLangFleet:
    """`entr_jax.interfaces.Sampler` backed by N SGLang servers (see module doc).

    Args:
      config: `SGLangFleetConfig`.
      transport: optional ``httpx`` transport (tests); None uses real sockets.
    """

    def __init__(self, config: SGLangFleetConfig, transport: httpx.BaseTransport | None = None):
        self.config = config
        headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        self._client = httpx.Client(
            headers=headers,
            timeout=httpx.Timeout(config.request_timeout_s, connect=config.connect_timeout_s),
            limits=httpx.Limits(max_connections=config.max_concurrency + 4 * len(config.server_urls)),
            transport=transport,
        )
        self._workers = Workers(config, self._client)
        self._routes = self._workers.pool  # routes /generate requests
        self._cond = self._routes.cond
        self._counters = self._routes.counters
        self._reply_ctx = ReplyContext(config.vocab_size, config.entropy_top_k,
                                       config.initial_version)
        self._executor = cf.ThreadPoolExecutor(config.max_concurrency, thread_name_prefix="sglang")
        self._halfwidth_sum = 0.0
        self._update_lock = threading.Lock()
        self._version = config.initial_version
        self._run_id = uuid.uuid4().hex[:8]
        self._calls = 0

    # ------------------------------------------------------------------ Sampler protocol
    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, num_samples: int = 1
    ) -> list[list[Generation]]:
        """Sample ``num_samples`` continuations of every prompt (protocol in `Sampler`).

        Returns ``[len(prompts)][num_samples]`` `Generation`s in prompt order; each
        (prompt, sample) is answered exactly once.

        Raises:
          ValueError: bad ``prompts``/``num_samples`` or filtering ``params``.
          RuntimeError: a unit failed ``max_attempts`` times, every server rejected it, or
            no server came back within ``outage_wait_s`` (`FleetError`; each message names
            every server and what it answered); or the router routes to a worker outside
            ``server_urls`` (checked on the first call).
        """
        check_params_supported(params)
        self._workers.check_router()
        if num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples}")
        prompt_lists = []
        for i, p in enumerate(prompts):
            ids = [int(t) for t in p]
            if not ids or min(ids) < 0:
                raise ValueError(f"prompts[{i}] must be a non-empty list of token ids >= 0")
            prompt_lists.append(ids)
        with self._cond:
            self._calls += 1
            call = self._calls
        futures = [
            [
                self._executor.submit(
                    self._sample_unit, ids, params,
                    _unit_seed(params.seed, call, i, s), f"{self._run_id}-{call}-{i}-{s}",
                )
                for s in range(num_samples)
            ]
            for i, ids in enumerate(prompt_lists)
        ]
        cf.wait([f for row in futures for f in row])
        return [[f.result() for f in row] for row in futures]

    def update_weights(self, params: Any, version: int) -> None:
        """Export ``params`` to ``export_dir/v{version}`` and load it on every server.

        Raises:
          ValueError: ``version`` lower than the current one.
          WeightSyncError: no server took the weights within ``outage_wait_s``.
        """
        self._check_version(version)
        path = os.path.join(self.config.export_dir, f"v{int(version)}")
        if os.path.isdir(path):
            shutil.rmtree(path)
        os.makedirs(path)
        export_fn = self.config.export_fn
        if export_fn is None:
            from entr_jax.model import save_pretrained as export_fn  # lazy: heavy deps
        export_fn(params, path)
        self.update_weights_from_path(path, version)
        self._prune_exports(int(version))

    def update_weights_from_path(self, path: str, version: int) -> None:
        """Load the HF checkpoint directory ``path`` on every server, tagged ``version``.

        Per server: pause (abort mode), ``/update_weights_from_disk``, continue, health.
        A server that fails is taken out of rotation and loads the weights when re-probed;
        sampling goes on on the others (a warning names the servers and their answers). A
        server the push killed is relaunched with ``path`` when ``config.relaunch`` is
        set. When no server took the weights, the push is an outage: it waits, as
        generation does, up to ``outage_wait_s`` for a server to come back and load them.
        Every case is counted (`metrics`: ``weight_update_failures`` per server,
        ``weight_update_partial``, ``weight_sync_outages``, ``weight_sync_recovered``,
        ``servers_relaunched``, ``relaunch_failures``).

        Raises:
          ValueError: ``path`` is not a directory or ``version`` is lower than the current.
          WeightSyncError: (a `FleetError`) no server took the weights within
            ``outage_wait_s``; the message names each server and what it answered.
        """
        if not os.path.isdir(path):
            raise ValueError(f"path {path!r} is not a directory")
        self._check_version(version)
        with self._update_lock:
            failed = self._workers.update_all(os.path.abspath(path), int(version))
            self._version = int(version)  # after the failed workers are out of rotation
            self._count("weight_updates")
            self._count("weight_update_failures", len(failed))
            failed = self._workers.relaunch(failed, os.path.abspath(path), int(version))
            answers = "; ".join(f"{f.url} {f.answer}" for f in failed)
            if failed and len(failed) < len(self._workers.servers):
                self._count("weight_update_partial")
                warnings.warn(
                    f"weight push of version {version} failed on {len(failed)} of "
                    f"{len(self._workers.servers)} SGLang servers ({answers}); they are out of "
                    "rotation until a re-probe loads it, and sampling goes on on the others",
                    stacklevel=2)
            elif failed:
                self._wait_out_push_outage(version, answers)

    def _wait_out_push_outage(self, version: int, answers: str) -> None:
        """No server took ``version``: wait for one to come back and load it (the re-probes
        do), up to ``outage_wait_s``, or raise `WeightSyncError`."""
        self._count("weight_sync_outages")
        wait = self.config.outage_wait_s
        warnings.warn(
            f"weight push of version {version} reached no SGLang server ({answers}); waiting "
            f"up to {wait:g} s (outage_wait_s) for one to come back and load it, re-probing "
            f"every {self.config.reprobe_interval_s:g} s", stacklevel=3)
        if self._routes.wait_for_worker():
            self._count("weight_sync_recovered")
            return
        raise WeightSyncError(
            f"weight push of version {version} failed: no SGLang server took it within "
            f"outage_wait_s={wait:g} s. What they answered: {answers}. Now: "
            f"{self._workers.pool.describe_workers()}. Nothing was trained on weights the "
            "servers do not serve. Check the servers (docs/sglang.md), then resume")

    def pause(self) -> None:
        """``/pause_generation`` (mode ``in_place``) on every server."""
        self._workers.broadcast("/pause_generation", {"mode": "in_place"})

    def resume(self) -> None:
        """``/continue_generation`` on every server."""
        self._workers.broadcast("/continue_generation", {})

    # ------------------------------------------------------------------ extras
    @property
    def version(self) -> int:
        """Version of the weights most recently pushed (``initial_version`` before any)."""
        return self._version

    def metrics(self) -> dict[str, float]:
        """Flat ``sglang/...`` values (floats): the `COUNTERS` since construction, and the
        state now: ``servers_unhealthy`` (workers out of rotation), ``router_unhealthy``
        (1 while requests bypass the router) and ``entropy_halfwidth_mean``."""
        with self._cond:
            out = {f"sglang/{k}": float(self._counters[k]) for k in COUNTERS}
            n = self._counters["tokens"]
            out["sglang/entropy_halfwidth_mean"] = self._halfwidth_sum / n if n else 0.0
            out["sglang/servers_unhealthy"] = float(sum(not s.healthy for s in self._workers.servers))
            router = self._routes.router
            out["sglang/router_unhealthy"] = float(router is not None and not router.healthy)
        return out

    def close(self) -> None:
        """Stop the worker threads and close connections."""
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._client.close()

    def __enter__(self) -> "SGLangFleet":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ sampling
    def _sample_unit(self, prompt: list[int], params: SamplingParams, seed: int | None,
                     rid: str) -> Generation:
        segments: list[Segment] = []
        produced, resumes, finish = 0, 0, "length"
        while produced < params.max_new_tokens:
            payload = build_generate_payload(
                prompt + [int(t) for s in segments for t in s.token_ids], params,
                params.max_new_tokens - produced, self.config.entropy_top_k,
                seed if self.config.send_sampling_seed else None, f"{rid}-{len(segments)}",
            )
            seg = self._request_segment(payload)
            segments.append(seg)
            produced += len(seg.token_ids)
            finish = seg.finish_type
            if finish != "abort":
                break
            if produced >= params.max_new_tokens:
                finish = "length"
                break
            if resumes >= self.config.max_resumes:
                break
            resumes += 1
            self._count("aborts_resumed")
        cat = lambda name, dt: np.concatenate(  # noqa: E731
            [np.asarray(getattr(s, name), dt) for s in segments] or [np.zeros(0, dt)])
        versions = np.concatenate(
            [np.full(len(s.token_ids), s.version, np.int32) for s in segments]
            or [np.zeros(0, np.int32)])
        return Generation(
            prompt_ids=np.asarray(prompt, np.int32),
            response_ids=cat("token_ids", np.int32),
            logp_mu=cat("logp", np.float32),
            entropy_mu=cat("entropy", np.float32),
            token_version=versions,
            finish_reason=finish,
            behavior=BehaviorParams.of(params),
        )

    def _request_segment(self, payload: dict[str, Any]) -> Segment:
        budget = payload["sampling_params"]["max_new_tokens"]
        timeout = httpx.Timeout(self.config.request_timeout(budget),
                                connect=self.config.connect_timeout_s)
        rejected: dict[str, str] = {}  # url -> answer of the servers that refused it
        last_url: list[str | None] = [None]
        charged = [0]  # failed tries that count against max_attempts

        def failed(server, why: str, counter: str) -> Retryable:
            """Release ``server`` after a failed try; the try counts against
            ``max_attempts`` only if the server is still in rotation (a failure that takes
            it out is the health rules' business: the request then waits for a server)."""
            self._routes.release(server, ok=False, counter=counter, error=why)
            with self._cond:
                charged[0] += server.healthy
            return Retryable(f"{server.url}: {why}")

        def attempt_once(n: int) -> Segment:
            server = self._routes.acquire(exclude=rejected)
            pushed = self._version  # fully pushed to every worker in rotation
            if n > 1:
                self._count("retries")
                if last_url[0] is not None and server.url != last_url[0]:
                    self._count("failovers")
            last_url[0] = server.url
            payload["rid"] = re.sub(r"-a\d+$", "", payload["rid"]) + f"-a{n}"
            try:
                resp = self._client.post(server.url + "/generate", json=payload, timeout=timeout)
            except httpx.TimeoutException:
                self._workers.abort_rid(server, payload["rid"])
                raise failed(server, f"no reply within {timeout.read:g} s", "timeouts") from None
            except httpx.TransportError as e:
                raise failed(server, repr(e), "connection_errors") from None
            if resp.status_code >= 500 or resp.status_code in (408, 429):
                raise failed(server, f"answered {resp.status_code}", "http_errors")
            if resp.status_code != 200:
                answer = f"answered {resp.status_code}: {resp.text[:300]}"
                rejected[server.url] = answer
                self._routes.reject(server, answer,
                                    server_level=resp.status_code in SERVER_LEVEL_REJECTIONS)
                raise Retryable(f"{server.url} {answer}")
            try:
                seg = parse_reply(decode_body(resp.content), payload, self._reply_ctx)
            except MalformedResponse as e:
                raise failed(server, f"malformed reply: {e}", "malformed_responses") from None
            self._routes.release(server, ok=True)
            if seg.version < pushed:
                self._workers.stale_reply(server)
            with self._cond:
                self._counters.update({k: v for k, v in seg.counts.items() if v})
                self._counters["tokens"] += len(seg.token_ids)
                self._halfwidth_sum += float(np.nansum(seg.entropy_halfwidth))
            return seg

        retrying = tenacity.Retrying(
            stop=lambda _: charged[0] >= self.config.max_attempts,
            wait=tenacity.wait_exponential(multiplier=self.config.backoff_initial_s,
                                           max=self.config.backoff_max_s),
            retry=tenacity.retry_if_exception_type(Retryable),
            reraise=True,
        )
        try:
            for attempt in retrying:
                with attempt:
                    return attempt_once(attempt.retry_state.attempt_number)
        except Retryable as e:
            raise FleetError(
                f"SGLang request failed {self.config.max_attempts} times on servers that "
                f"stayed in rotation (max_attempts); last error: {e}. Check the servers "
                "(docs/sglang.md) or raise sampler.fleet.max_attempts") from None
        raise AssertionError("unreachable")

    # ------------------------------------------------------------------ bookkeeping
    def _count(self, key: str, n: int = 1) -> None:
        self._workers.pool.count(key, n)

    def _check_version(self, version: int) -> None:
        if isinstance(version, bool) or not isinstance(version, (int, np.integer)) or version < 0:
            raise ValueError(f"version must be an int >= 0, got {version!r}")
        if version < self._version:
            raise ValueError(f"version {version} is lower than the current version {self._version}")

    def _prune_exports(self, current: int) -> None:
        root = self.config.export_dir
        versions = sorted(int(m.group(1)) for d in os.listdir(root)
                          if (m := re.fullmatch(r"v(\d+)", d)))
        for v in versions[: max(0, len(versions) - self.config.keep_exports)]:
            if v != current:
                shutil.rmtree(os.path.join(root, f"v{v}"), ignore_errors=True)


def _unit_seed(seed: int, call: int, prompt: int, sample: int) -> int:
    """Deterministic 31-bit ``sampling_seed`` of one unit (same for all its segments)."""
    mixed = np.random.SeedSequence([seed & 0xFFFFFFFF, call, prompt, sample]).generate_state(1)[0]
    return int(mixed & 0x7FFFFFFF)
