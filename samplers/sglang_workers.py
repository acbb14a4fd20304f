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

import httpx

from samplers.sglang_config import SGLangFleetConfig
from samplers.sglang_protocol import parse_weight_version
from samplers.sglang_router import RouterControl, VersionWatch
from samplers.sglang_routing import Server, ServerPool


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

    def update_all(self, path: str, version: int) -> list[tuple[str, str]]:
        """Load ``path`` as ``version`` on every worker in parallel; the ones that fail are
        taken out (and caught up when re-probed). Returns ``[(url, error)]`` of failures."""
        with cf.ThreadPoolExecutor(len(self.servers)) as control_pool:
            errors = list(control_pool.map(lambda s: self.update_one(s, path, version),
                                           self.servers))
        self.latest = (path, int(version))
        failed = [(s.url, e) for s, e in zip(self.servers, errors) if e is not None]
        for s, e in zip(self.servers, errors):
            if e is not None:
                self.take_out(s)
        return failed

    def update_one(self, server: Server, path: str, version: int) -> str | None:
        """Pause, load ``path`` as ``version``, continue, health-check one worker; error or None."""
        try:
            self.control(server, "POST", "/pause_generation", {"mode": "abort"})
            try:
                body = self.control(server, "POST", "/update_weights_from_disk", {
                    "model_path": path, "weight_version": str(int(version)),
                    "flush_cache": True, "abort_all_requests": True}).json()
                if not isinstance(body, dict) or body.get("success") is not True:
                    raise RuntimeError(f"update_weights_from_disk failed: {body!r}")
            finally:
                self.control(server, "POST", "/continue_generation", {})
            self.control(server, "GET", "/health_generate")
            return None
        except (httpx.HTTPError, ValueError, RuntimeError) as e:
            return f"{type(e).__name__}: {e}"

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
            version, latest = self.read_version(server), self.latest
            if latest is not None and version < latest[1]:
                if self.update_one(server, *latest) is not None:
                    return False
            else:
                self.control(server, "GET", "/health_generate")
            if self.router is not None and self.pool.router.healthy:
                self.router.add(server.url)
                self.pool.count("router_additions")
            return True
        except (httpx.HTTPError, ValueError, RuntimeError, AttributeError):
            return False

    def read_version(self, server: Server) -> int:
        """The integer version of the weights ``server`` has loaded (``/get_model_info``)."""
        info = self.control(server, "GET", "/get_model_info").json()
        return parse_weight_version(info.get("weight_version"), self.config.initial_version)

    def take_out(self, server: Server) -> None:
        """Out of rotation until a re-probe catches it up (and out of the router, if any)."""
        self.pool.mark_unhealthy(server)
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
