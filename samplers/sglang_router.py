"""The fleet client's side of SGLang's own router (``sglang-router`` on PyPI, a Rust binary).

With ``SGLangFleetConfig.router_url`` set, every ``/generate`` goes to the router, which
picks a worker (cache-aware by default), health-checks the workers, retries a failed request
on another worker (408/429/5xx and dropped connections) and opens a per-worker circuit
breaker. What the router cannot do stays with the client, on the workers directly
(``SGLangFleetConfig.server_urls``): weight pushes, pause/continue, the version check and
resuming aborted samples. Facts about router 0.3.2 this module relies on (its README and
``sglang_router.launch_router --help``; checked by running it against
``tests/sglang_fake_server.py``):

* The router forwards ``/generate`` bodies re-serialised through its typed request: every
  field the client sends (``input_ids``, ``sampling_params`` with ``sampling_seed``, ``n``,
  ``stop_token_ids``..., ``return_logprob``, ``logprob_start_len``, ``top_logprobs_num``,
  ``return_text_in_logprobs``, ``rid``, ``stream``) arrives unchanged, fields it does not
  know are dropped, and defaults of its own are added (``return_entropy: false``, ...).
  Replies come back byte for byte, ``meta_info.weight_version`` included.
* It has no ``/pause_generation``, ``/continue_generation``, ``/update_weights_from_disk``
  or ``/abort_request`` route (404) and it does not carry weight versions.
* Worker registry: ``GET /workers`` lists ``{"id", "url", "is_healthy", ...}`` entries;
  ``POST /workers`` with ``{"url", "api_key"}`` and ``DELETE /workers/{id}`` queue an
  addition or a removal (``202``, applied in the background). Workers named on its command
  line get the router's ``--api-key``; workers added later only with ``api_key`` given.
* A worker is registered only once its ``GET /health`` answers 200 (no key needed); the
  router then reads ``/server_info`` and ``/model_info`` (falling back to
  ``/get_server_info`` and ``/get_model_info``).

Why the client still manages membership: a worker that missed a weight push (it was down)
or came back with its startup weights would be put back in rotation by the router's own
health checks and serve old weights. Its tokens would still carry the right
``weight_version``, but they would be needlessly stale. So the client removes such a worker
from the router, loads the newest weights on it directly, and only then adds it back.

The router itself is one more server of the fleet's `samplers.sglang_routing.ServerPool`:
while it is in rotation every request goes to it; when it fails ``unhealthy_after`` times
in a row (it died, or it refuses the client's key) requests go to the workers directly,
and the router is re-probed; once it answers again its registry is brought back in line
with the workers in rotation (`RouterControl.check_members`) before it takes requests.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Sequence

import httpx

from samplers.sglang_routing import Server, ServerPool

_POLL_S = 0.05  # registry polling interval while waiting for a queued job, seconds


class RouterControl:
    """Membership of the workers in one router, through its worker-registry API.

    Args:
      client: the fleet's ``httpx.Client`` (its headers carry the API key, if any).
      url: router base URL.
      timeout_s: timeout of each registry call, seconds.
      worker_api_key: sent as ``api_key`` when a worker is added (the router does not pass
        its own key to workers added at run time).
    """

    def __init__(self, client: httpx.Client, url: str, timeout_s: float,
                 worker_api_key: str | None):
        self.client = client
        self.url = url
        self.timeout_s = timeout_s
        self.worker_api_key = worker_api_key

    def workers(self) -> dict[str, dict]:
        """``{worker url: registry entry}`` as the router lists them now.

        Raises:
          RuntimeError: the router did not answer with a worker list.
        """
        resp = self.client.get(self.url + "/workers", timeout=self.timeout_s)
        body = resp.json() if resp.status_code == 200 else None
        if not isinstance(body, dict) or not isinstance(body.get("workers"), list):
            raise RuntimeError(f"GET {self.url}/workers -> {resp.status_code}: {resp.text[:300]}")
        return {str(w.get("url", "")).rstrip("/"): w for w in body["workers"] if isinstance(w, dict)}

    def remove(self, worker_url: str) -> None:
        """Remove ``worker_url`` from the router and wait until it is no longer listed
        (no-op when it is not listed).

        Raises:
          RuntimeError: the router refused, or still lists the worker after ``timeout_s``.
        """
        entry = self.workers().get(worker_url)
        if entry is None:
            return
        resp = self.client.delete(f"{self.url}/workers/{entry.get('id')}", timeout=self.timeout_s)
        if resp.status_code not in (200, 202, 404):
            raise RuntimeError(f"DELETE {self.url}/workers/{entry.get('id')} ({worker_url}) -> "
                               f"{resp.status_code}: {resp.text[:300]}")
        self._wait(lambda listed: worker_url not in listed, f"removal of {worker_url}")

    def add(self, worker_url: str) -> None:
        """Register ``worker_url`` with the router and wait until it is listed healthy
        (no-op when it is listed already).

        Raises:
          RuntimeError: the router refused, or has not listed the worker as healthy after
            ``timeout_s``.
        """
        if worker_url in self.workers():
            return
        body = {"url": worker_url}
        if self.worker_api_key:
            body["api_key"] = self.worker_api_key
        resp = self.client.post(self.url + "/workers", json=body, timeout=self.timeout_s)
        if resp.status_code not in (200, 201, 202):
            raise RuntimeError(f"POST {self.url}/workers ({worker_url}) -> {resp.status_code}: "
                               f"{resp.text[:300]}")
        self._wait(lambda listed: listed.get(worker_url, {}).get("is_healthy") is True,
                   f"registration of {worker_url}")

    def _wait(self, done: Callable[[dict[str, dict]], bool], what: str) -> None:
        """Poll `workers` until ``done(listed)`` (registry jobs run in the background)."""
        deadline = time.monotonic() + self.timeout_s
        while not done(self.workers()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the router at {self.url} did not finish the {what} "
                                   f"within {self.timeout_s} s")
            time.sleep(_POLL_S)

    def serves(self) -> bool:
        """Whether the router lists at least one healthy worker (its ``/workers``): a
        router that answers while every worker is down would only answer 503."""
        return any(w.get("is_healthy") is True for w in self.workers().values())

    def check_members(self, worker_urls: Sequence[str],
                      out_of_rotation: Sequence[str] = ()) -> None:
        """Make the router's workers ``worker_urls`` minus ``out_of_rotation``: add the
        missing ones (e.g. taken out by a client that stopped before adding them back, or
        lost by a router that restarted) and remove those out of rotation (they catch up
        first and are added back then).

        Raises:
          RuntimeError: the router routes to a worker not in ``worker_urls``; that worker
            would never receive weight updates.
        """
        listed = self.workers()
        unknown = sorted(set(listed) - set(worker_urls))
        if unknown:
            raise RuntimeError(
                f"the router at {self.url} routes to {unknown}, which are not in "
                f"SGLangFleetConfig.server_urls {tuple(worker_urls)}: they would never receive "
                "weight updates. List every worker in server_urls (same spelling as the "
                "router's --worker-urls).")
        for url in worker_urls:
            if url in out_of_rotation:
                if url in listed:
                    self.remove(url)
            elif url not in listed:
                self.add(url)


class VersionWatch:
    """Checks every worker's ``weight_version`` directly, in the background, when asked.

    `request_check` starts at most one check at a time; the check calls
    ``take_out(server)`` for each in-rotation worker that reports a version older than
    ``latest()`` or does not answer (a worker already ahead, mid-push, is fine). Used when a reply comes back with an older version
    than the fleet had fully pushed when the request was sent: some worker behind the
    router is behind, and the router cannot say which one served the reply.

    Args:
      pool: the workers.
      read_version: ``read_version(server) -> int`` (raises on any failure).
      latest: ``latest() -> int | None``, the newest version pushed (None before any).
      take_out: ``take_out(server)``.
    """

    def __init__(self, pool: ServerPool, read_version: Callable[[Server], int],
                 latest: Callable[[], int | None], take_out: Callable[[Server], None]):
        self._pool = pool
        self._read_version = read_version
        self._latest = latest
        self._take_out = take_out
        self._running = False
        self._lock = threading.Lock()

    def request_check(self) -> bool:
        """Start a check unless one is running; True when one was started."""
        with self._lock:
            if self._running:
                return False
            self._running = True
        threading.Thread(target=self._check, daemon=True).start()
        return True

    def _check(self) -> None:
        try:
            self._pool.count("version_checks")
            latest = self._latest()
            with self._pool.cond:
                in_rotation = [s for s in self._pool.servers if s.healthy]
            for server in in_rotation:
                try:
                    ok = latest is None or self._read_version(server) >= latest
                except Exception:  # noqa: BLE001 - unreachable or unreadable: take it out
                    ok = False
                if not ok:
                    self._take_out(server)
        finally:
            with self._lock:
                self._running = False
