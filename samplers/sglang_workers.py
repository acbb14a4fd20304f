"""The SGLang workers as the fleet client controls them directly: weight loading,
pause/continue, the version check, health re-probes and (with a router) their membership in
the router's registry. Generation requests are routed by `Workers.pool` (`ServerPool`): to
the router while it is in rotation (``config.router_url``), else to the worker in rotation
with the fewest outstanding requests. See ``docs/sglang.md``.

Loading one worker (`Workers.update_one`): ``POST /pause_generation {"mode": "abort"}``
(in-flight requests return at once with the tokens and version they have),
``/update_weights_from_disk`` (``model_path``, ``weight_version``, ``flush_cache``,
``abort_all_requests``; must answer ``success: true``), ``/continue_generation`` (always,
also after a failed load) and ``GET /health_generate``. Modes ``in_place``/``retract``
would let one reply mix tokens of two weight versions under a single ``weight_version``.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses

import httpx

from samplers.sglang_config import SGLangFleetConfig
from samplers.sglang_protocol import parse_weight_version
from samplers.sglang_router import RouterControl, VersionWatch
from samplers.sglang_routing import Server, ServerPool


@dataclasses.dataclass(frozen=True)
class PushFailure:
    """A worker that did not take a weight push.

    Attributes:
      url: the worker.
      answer: the first thing that failed and what it answered (route, error).
      died: the connection broke during ``/update_weights_from_disk`` (the reload killed
        the server, or it died meanwhile): a relaunch may bring it back.
    """

    url: str
    answer: str
    died: bool = False


class Workers:
    """Direct control of ``config.server_urls`` (see module doc).

    Args:
      config: `SGLangFleetConfig`.
      client: the fleet's ``httpx.Client``.

    Attributes:
      pool: routing and health state of the workers and the router (`ServerPool`); shares
        its lock and counters with the fleet.
      router: `RouterControl` when ``config.router_url`` is set, else None.
      latest: ``(path, version)`` of the newest successful push, or None.
    """

    def __init__(self, config: SGLangFleetConfig, client: httpx.Client):
        self.config = config
        self._client = client
        self.pool = ServerPool(config.server_urls, config.unhealthy_after,
                               config.reprobe_interval_s, config.outage_wait_s, self.probe,
                               router_url=config.router_url)
        self.servers = self.pool.servers
        self.router: RouterControl | None = None
        self.latest: tuple[str, int] | None = None
        self._router_checked = False
        if config.router_url is not None:
            self.router = RouterControl(client, config.router_url, config.control_timeout_s,
                                        config.api_key)
            self._watch = VersionWatch(self.pool, self.read_version,
                                       lambda: self.latest and self.latest[1], self.take_out)

    def check_router(self) -> None:
        """Once: the router routes only to ``server_urls`` (`RouterControl.check_members`).

        Raises:
          RuntimeError: the router is unreachable, refuses, or routes to other workers.
        """
        if self.router is None or self._router_checked:
            return
        try:
            self.router.check_members(self.config.server_urls)
        except (httpx.HTTPError, ValueError) as e:
            raise RuntimeError(f"could not read the worker list of the router at "
                               f"{self.router.url} (SGLangFleetConfig.router_url): {e!r}") from None
        self._router_checked = True

    def update_all(self, path: str, version: int) -> list[PushFailure]:
        """Load ``path`` as ``version`` on every worker in parallel; the ones that fail are
        taken out (and caught up when re-probed). Returns the failures."""
        with cf.ThreadPoolExecutor(len(self.servers)) as control_pool:
            results = list(control_pool.map(lambda s: self.update_one(s, path, version),
                                            self.servers))
        self.latest = (path, int(version))
        failed = [r for r in results if r is not None]
        for s, r in zip(self.servers, results):
            if r is not None:
                self.take_out(s, r.answer)
        return failed

    def update_one(self, server: Server, path: str, version: int) -> PushFailure | None:
        """Pause, load ``path`` as ``version``, continue, health-check one worker; None when
        it took the weights, else what it answered first (`PushFailure`)."""
        def fail(route: str, e: Exception) -> PushFailure:
            return PushFailure(server.url, f"{route}: {type(e).__name__}: {e}",
                               died=route == "/update_weights_from_disk"
                               and isinstance(e, httpx.TransportError))

        try:
            self.control(server, "POST", "/pause_generation", {"mode": "abort"})
        except (httpx.HTTPError, RuntimeError) as e:
            return fail("/pause_generation", e)
        failure = None
        try:
            body = self.control(server, "POST", "/update_weights_from_disk", {
                "model_path": path, "weight_version": str(int(version)),
                "flush_cache": True, "abort_all_requests": True}).json()
            if not isinstance(body, dict) or body.get("success") is not True:
                raise RuntimeError(f"update_weights_from_disk failed: {body!r}")
        except (httpx.HTTPError, ValueError, RuntimeError) as e:
            failure = fail("/update_weights_from_disk", e)
        try:  # always, also after a failed load
            self.control(server, "POST", "/continue_generation", {})
            if failure is None:
                self.control(server, "GET", "/health_generate")
        except (httpx.HTTPError, RuntimeError) as e:
            failure = failure or fail("/continue_generation or /health_generate", e)
        return failure

    def relaunch(self, failures: list[PushFailure], path: str, version: int) -> list[PushFailure]:
        """Restart, with ``config.relaunch`` and the checkpoint ``path`` tagged ``version``,
        every worker the push killed (``died``); a relaunched worker that reports
        ``version`` is back in rotation. Returns the failures that remain (a relaunch that
        failed says so in its answer). Without ``config.relaunch`` nothing changes."""
        if self.config.relaunch is None:
            return failures
        left = []
        for f in failures:
            if not f.died:
                left.append(f)
                continue
            server = next(s for s in self.servers if s.url == f.url)
            try:
                self.config.relaunch(f.url, path, int(version))
                got = self.read_version(server)
                if got != int(version):
                    raise RuntimeError(f"relaunched, but it serves version {got}")
            except Exception as e:  # noqa: BLE001 - a relaunch that fails is reported, not raised
                self.pool.count("relaunch_failures")
                answer = f"{f.answer}; relaunch failed: {type(e).__name__}: {e}"
                self.pool.note_error(server, answer)
                left.append(dataclasses.replace(f, answer=answer))
                continue
            self.pool.count("servers_relaunched")
            self.pool.mark_healthy(server)
            if self.router is not None and self.pool.router.healthy:
                self.router.add(server.url)
                self.pool.count("router_additions")
        return left

    def probe(self, server: Server) -> bool:
        """Re-probe of a server out of rotation; True brings it back.

        The router: its registry must answer, list a healthy worker, and is brought in
        line with the workers in rotation (`RouterControl.check_members`). A worker: its
        version is read (an authenticated call, so a worker that refuses the key stays
        out); it loads the latest weights if it is behind, else ``/health_generate`` must
        answer; with a router in rotation it is added back to it."""
        try:
            if server is self.pool.router:
                with self.pool.cond:
                    out = [s.url for s in self.servers if not s.healthy]
                self.router.check_members(self.config.server_urls, out_of_rotation=out)
                return self.router.serves()
            latest = self.latest
            if latest is not None and self.behind(server, latest[1]):
                failure = self.update_one(server, *latest)
                if failure is not None:
                    self.pool.note_error(server, failure.answer)
                    return False
            else:
                self.control(server, "GET", "/health_generate")
            if self.router is not None and self.pool.router.healthy:
                self.router.add(server.url)
                self.pool.count("router_additions")
            return True
        except (httpx.HTTPError, ValueError, RuntimeError, AttributeError):
            return False

    def behind(self, server: Server, version: int) -> bool:
        """Whether ``server`` serves weights older than ``version``: a lower version, or
        its startup weights (``"default"``: a server restarted after a push, even of the
        version ``initial_version`` names, does not serve what was pushed)."""
        raw = self.control(server, "GET", "/get_model_info").json().get("weight_version")
        if raw is None or raw == "default":
            return True
        return parse_weight_version(raw, self.config.initial_version) < version

    def read_version(self, server: Server) -> int:
        """The integer version of the weights ``server`` has loaded (``/get_model_info``)."""
        info = self.control(server, "GET", "/get_model_info").json()
        return parse_weight_version(info.get("weight_version"), self.config.initial_version)

    def take_out(self, server: Server, error: str | None = None) -> None:
        """Out of rotation until a re-probe catches it up (and out of the router, if any);
        ``error`` is what it answered."""
        self.pool.mark_unhealthy(server, error)
        if self.router is not None and self.pool.router.healthy:  # else: when it is back
            try:
                self.router.remove(server.url)
                self.pool.count("router_removals")
            except (httpx.HTTPError, ValueError, RuntimeError):
                self.pool.count("router_errors")

    def stale_reply(self, server: Server) -> None:
        """A reply came back older than the version fully pushed when it was sent: its worker
        fell behind (e.g. restarted with its startup weights). Without a router that is
        ``server``; the router does not say which worker answered, so every worker's version
        is checked (in the background)."""
        self.pool.count("stale_replies")
        if self.router is None:
            self.take_out(server)
        else:
            self._watch.request_check()

    def control(self, server: Server, method: str, route: str,
                body: dict | None = None) -> httpx.Response:
        """One control call; raises RuntimeError unless it answers 200."""
        resp = self._client.request(method, server.url + route, json=body,
                                    timeout=self.config.control_timeout_s)
        if resp.status_code != 200:
            raise RuntimeError(f"{method} {server.url}{route} -> {resp.status_code}: {resp.text[:300]}")
        return resp

    def broadcast(self, route: str, body: dict) -> None:
        """POST ``route`` to every worker; raises RuntimeError listing the ones that failed."""
        errors = []
        for s in self.servers:
            try:
                self.control(s, "POST", route, body)
            except (httpx.HTTPError, RuntimeError) as e:
                errors.append(f"{s.url}: {e}")
        if errors:
            raise RuntimeError(f"{route} failed on {len(errors)} server(s): {errors}")

    def abort_rid(self, server: Server, rid: str) -> None:
        """Best-effort ``/abort_request`` of a timed-out request: on ``server``, or when it
        went through the router (which has no such route and does not say where the
        request went) on every worker."""
        for target in (self.servers if server is self.pool.router else [server]):
            try:
                self._client.post(target.url + "/abort_request", json={"rid": rid},
                                  timeout=self.config.connect_timeout_s)
            except httpx.HTTPError:
                pass
