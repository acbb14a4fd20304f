"""Server selection and health for the SGLang fleet: least outstanding requests over the
workers (or the router first, when there is one), failure counting, taking servers out
of rotation, re-probing them in the background, and waiting out an outage.

Thread-safe: every state change happens under one `threading.Condition`, which also
guards the fleet's counters (`ServerPool.counters`).
"""

from __future__ import annotations

import collections
import threading
import time
import warnings
from typing import Callable, Mapping, Sequence


class Retryable(Exception):
    """A failed try of one request that another try (maybe on another server) may fix."""


class FleetError(RuntimeError):
    """The fleet cannot answer a request: every server rejected it, or none came back
    within the outage wait. The message names each server and what it answered."""


class WeightSyncError(FleetError):
    """A weight push that no SGLang server took, even after waiting ``outage_wait_s`` for
    one to come back and load it: the run must stop rather than train on weights that no
    server samples from. The message names each server and what it answered."""


class Server:
    """Routing state of one server (all fields guarded by the pool's condition)."""

    def __init__(self, url: str):
        self.url = url
        self.outstanding = 0
        self.failures = 0
        self.healthy = True
        self.next_probe = 0.0
        self.probing = False
        self.last_error: str | None = None


class ServerPool:
    """Least-outstanding-requests routing over servers with health tracking.

    Args:
      urls: the workers' base URLs (`servers`).
      unhealthy_after: consecutive failures that take a server out of rotation.
      reprobe_interval_s: delay before a server out of rotation is probed again (seconds).
      outage_wait_s: how long `acquire` waits while no server is in rotation (seconds).
      probe: ``probe(server) -> bool``; true brings the server back into rotation. Runs
        on a daemon thread, outside the lock.
      router_url: an ``sglang-router`` in front of the workers (`router`), or None. While
        it is in rotation every request goes to it; while it is out, to the workers.
    """

    def __init__(self, urls: Sequence[str], unhealthy_after: int, reprobe_interval_s: float,
                 outage_wait_s: float, probe: Callable[[Server], bool],
                 router_url: str | None = None):
        self.servers = [Server(u) for u in urls]
        self.router = Server(router_url) if router_url else None
        self.cond = threading.Condition()
        self.counters: collections.Counter[str] = collections.Counter()
        self._unhealthy_after = unhealthy_after
        self._reprobe_interval_s = reprobe_interval_s
        self._outage_wait_s = outage_wait_s
        self._probe = probe
        self._outage_since: float | None = None

    def candidates(self) -> list[Server]:
        """Every server a request may go to: the router (if any) first, then the workers."""
        return ([self.router] if self.router is not None else []) + self.servers

    def acquire(self, exclude: Mapping[str, str] | None = None) -> Server:
        """The router when it is in rotation, else the worker in rotation with the fewest
        outstanding requests (its count is raised); servers whose URL is in ``exclude``
        (they rejected this request) are skipped.

        Starts background probes of servers out of rotation that are due. While none is in
        rotation, waits for one to come back (one warning per outage), up to
        ``outage_wait_s``.

        Raises:
          FleetError: every server is in ``exclude`` (the message lists their answers), or
            none came back within ``outage_wait_s`` (the message lists their last errors).
        """
        exclude = exclude or {}
        deadline = None
        with self.cond:
            while True:
                self._start_due_probes()
                allowed = [s for s in self.candidates() if s.url not in exclude]
                if not allowed:
                    raise FleetError(
                        "every SGLang server rejected the request: "
                        + "; ".join(f"{url} {answer}" for url, answer in exclude.items())
                        + ". A 401/403 is a wrong or missing key (sampler.api_key, "
                        "SGLangFleetConfig.api_key); a 400 a request the server refuses "
                        "(its answer says why); a 404 a URL that is not an SGLang server")
                healthy = [s for s in allowed if s.healthy]
                if healthy:
                    if self._outage_since is not None:
                        self._outage_since = None
                    server = healthy[0] if healthy[0] is self.router else min(
                        healthy, key=lambda s: s.outstanding)
                    if self.router is not None and server is not self.router:
                        self.counters["router_bypassed"] += 1
                    server.outstanding += 1
                    return server
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self._outage_wait_s
                    self.counters["outage_waits"] += 1
                    if self._outage_since is None:
                        self._outage_since = now
                        self.counters["outages"] += 1
                        warnings.warn(
                            f"no SGLang server is in rotation ({self._describe(allowed)}); "
                            f"requests wait up to {self._outage_wait_s:g} s "
                            f"(outage_wait_s) for one to come back, re-probing every "
                            f"{self._reprobe_interval_s:g} s", stacklevel=2)
                if now >= deadline:
                    raise FleetError(
                        f"no SGLang server came back within outage_wait_s="
                        f"{self._outage_wait_s:g} s: {self._describe(allowed)}. Check the "
                        "servers (docs/sglang.md) or raise sampler.fleet.outage_wait_s")
                due = min((s.next_probe for s in allowed if not s.probing), default=deadline)
                self.cond.wait(timeout=max(0.001, min(deadline, due) - now))

    def release(self, server: Server, ok: bool, counter: str | None = None,
                error: str | None = None) -> None:
        """End one request on ``server``; a failure (``error`` says what) counts toward
        taking it out of rotation."""
        with self.cond:
            server.outstanding -= 1
            if counter:
                self.counters[counter] += 1
            if ok:
                server.failures = 0
                return
            server.failures += 1
            server.last_error = error
            if server.failures >= self._unhealthy_after and server.healthy:
                self._set_unhealthy(server)

    def reject(self, server: Server, answer: str, server_level: bool) -> None:
        """End one request that ``server`` refused (a 4xx ``answer``). A server-level
        refusal (wrong key, unknown route) takes it out of rotation at once; a refusal
        of this request only leaves it in."""
        with self.cond:
            server.outstanding -= 1
            self.counters["rejections"] += 1
            server.last_error = answer
            if server_level and server.healthy:
                self._set_unhealthy(server)

    def mark_unhealthy(self, server: Server, error: str | None = None) -> None:
        """Take ``server`` out of rotation now (e.g. it missed a weight update; ``error``
        says what it answered)."""
        with self.cond:
            if error is not None:
                server.last_error = error
            if server.healthy:
                self._set_unhealthy(server)
            server.next_probe = time.monotonic() + self._reprobe_interval_s

    def mark_healthy(self, server: Server) -> None:
        """Put ``server`` back in rotation now (e.g. relaunched with the newest weights)."""
        with self.cond:
            if not server.healthy:
                server.healthy, server.failures = True, 0
                self.counters["servers_recovered"] += 1
            server.last_error = None
            self.cond.notify_all()

    def note_error(self, server: Server, error: str) -> None:
        """Record what ``server`` answered last (named when an outage is reported)."""
        with self.cond:
            server.last_error = error

    def wait_for_worker(self) -> bool:
        """Wait (re-probing in the background) until a worker is in rotation, up to
        ``outage_wait_s``; False if none came back. A worker that missed the newest weight
        push loads it in its re-probe before it rejoins (`Workers.probe`)."""
        deadline = time.monotonic() + self._outage_wait_s
        with self.cond:
            while True:
                self._start_due_probes()
                if any(s.healthy for s in self.servers):
                    return True
                now = time.monotonic()
                if now >= deadline:
                    return False
                due = min((s.next_probe for s in self.servers if not s.probing),
                          default=deadline)
                self.cond.wait(timeout=max(0.001, min(deadline, due) - now))

    def describe_workers(self) -> str:
        """Each worker's URL and what it last answered (for error messages)."""
        with self.cond:
            return self._describe(self.servers)

    def poll(self) -> None:
        """Start the background re-probes that are due (`acquire` does this too)."""
        with self.cond:
            self._start_due_probes()

    def count(self, key: str, n: int = 1) -> None:
        with self.cond:
            self.counters[key] += n

    def _describe(self, servers: Sequence[Server]) -> str:
        return "; ".join(f"{s.url}: {s.last_error or 'out of rotation'}" for s in servers)

    def _set_unhealthy(self, server: Server) -> None:
        server.healthy = False
        server.next_probe = time.monotonic() + self._reprobe_interval_s
        self.counters["router_marked_unhealthy" if server is self.router
                      else "servers_marked_unhealthy"] += 1

    def _start_due_probes(self) -> None:
        now = time.monotonic()
        for s in self.candidates():
            if not s.healthy and not s.probing and s.next_probe <= now:
                s.probing = True
                threading.Thread(target=self._probe_and_set, args=(s,), daemon=True).start()

    def _probe_and_set(self, server: Server) -> None:
        self.count("probes")
        try:
            ok = self._probe(server)
        except Exception:  # noqa: BLE001 - a probe that crashes is a failed probe
            ok = False
        with self.cond:
            server.probing = False
            if ok:
                server.healthy, server.failures = True, 0
                self.counters["router_recovered" if server is self.router
                              else "servers_recovered"] += 1
            else:
                server.next_probe = time.monotonic() + self._reprobe_interval_s
            self.cond.notify_all()
