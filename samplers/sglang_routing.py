"""Server selection and health for the SGLang fleet: least outstanding requests, failure
counting, taking servers out of rotation and re-probing them in the background.

Thread-safe: every state change happens under one `threading.Condition`, which also
guards the fleet's counters (`ServerPool.counters`).
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Callable, Sequence


class Retryable(Exception):
    """A failed try of one request that another try (maybe on another server) may fix."""


class Server:
    """Routing state of one server (all fields guarded by the pool's condition)."""

    def __init__(self, url: str):
        self.url = url
        self.outstanding = 0
        self.failures = 0
        self.healthy = True
        self.next_probe = 0.0
        self.probing = False


class ServerPool:
    """Least-outstanding-requests routing over servers with health tracking.

    Args:
      urls: server base URLs.
      unhealthy_after: consecutive failures that take a server out of rotation.
      reprobe_interval_s: delay before an unhealthy server is probed again (seconds).
      wait_timeout_s: how long `acquire` waits for a running probe when no server is
        healthy (seconds).
      probe: ``probe(server) -> bool``; true brings the server back into rotation. Runs
        on a daemon thread, outside the lock.
    """

    def __init__(self, urls: Sequence[str], unhealthy_after: int, reprobe_interval_s: float,
                 wait_timeout_s: float, probe: Callable[[Server], bool]):
        self.servers = [Server(u) for u in urls]
        self.cond = threading.Condition()
        self.counters: collections.Counter[str] = collections.Counter()
        self._unhealthy_after = unhealthy_after
        self._reprobe_interval_s = reprobe_interval_s
        self._wait_timeout_s = wait_timeout_s
        self._probe = probe

    def acquire(self) -> Server:
        """The healthy server with the fewest outstanding requests (its count is raised).

        Starts background probes of unhealthy servers that are due. When no server is
        healthy, waits (bounded) for a running probe to bring one back.

        Raises:
          Retryable: no server is healthy.
        """
        with self.cond:
            self._start_due_probes()
            if not any(s.healthy for s in self.servers) and any(s.probing for s in self.servers):
                self.cond.wait_for(
                    lambda: any(s.healthy for s in self.servers)
                    or not any(s.probing for s in self.servers),
                    timeout=self._wait_timeout_s)
            healthy = [s for s in self.servers if s.healthy]
            if not healthy:
                raise Retryable("no healthy SGLang server")
            server = min(healthy, key=lambda s: s.outstanding)
            server.outstanding += 1
            return server

    def release(self, server: Server, ok: bool, counter: str | None = None) -> None:
        """End one request on ``server``; a failure counts toward taking it out of rotation."""
        with self.cond:
            server.outstanding -= 1
            if counter:
                self.counters[counter] += 1
            if ok:
                server.failures = 0
                return
            server.failures += 1
            if server.failures >= self._unhealthy_after and server.healthy:
                self._set_unhealthy(server)

    def mark_unhealthy(self, server: Server) -> None:
        """Take ``server`` out of rotation now (e.g. it missed a weight update)."""
        with self.cond:
            if server.healthy:
                self._set_unhealthy(server)
            server.next_probe = time.monotonic() + self._reprobe_interval_s

    def poll(self) -> None:
        """Start the background re-probes that are due (`acquire` does this too)."""
        with self.cond:
            self._start_due_probes()

    def count(self, key: str, n: int = 1) -> None:
        with self.cond:
            self.counters[key] += n

    def _set_unhealthy(self, server: Server) -> None:
        server.healthy = False
        server.next_probe = time.monotonic() + self._reprobe_interval_s
        self.counters["servers_marked_unhealthy"] += 1

    def _start_due_probes(self) -> None:
        now = time.monotonic()
        for s in self.servers:
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
                self.counters["servers_recovered"] += 1
            else:
                server.next_probe = time.monotonic() + self._reprobe_interval_s
            self.cond.notify_all()
