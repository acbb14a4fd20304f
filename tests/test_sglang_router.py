"""The fleet client behind the real ``sglang-router`` binary (PyPI ``sglang-router==0.3.2``,
a Rust router that runs on CPU) in front of fault-injecting fake SGLang workers.

Every token's ``token_version`` is checked against the weights that made it: the toy model's
log-probs depend on the loaded weights, so ``logp_mu`` of a token equals the toy log-prob
under the weights of the version it is labelled with, and under no other.
"""

from __future__ import annotations

import collections
import re
import socket
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import pytest

from entr_jax.interfaces import SamplingParams
from samplers.sglang_config import SGLangFleetConfig
from samplers.sglang_fleet import SGLangFleet
from samplers.sglang_protocol import build_generate_payload
from tests.sglang_fake_server import VOCAB, FakeSGLangServer, dir_seed, toy_logprobs

pytest.importorskip("sglang_router", reason="needs sglang-router (pip install -e '.[dev]')")

PARAMS = SamplingParams(temperature=0.8, max_new_tokens=6, stop_token_ids=(0,), seed=5)
K = 4
STARTUP_S = 60.0  # the router registers workers in the background; generous on a loaded CI
# ``python -m sglang_router.launch_router`` minus its import of the Python debugging balancer
# (MiniLoadBalancer: fastapi + aiohttp, ~4-7 s of imports on a loaded 2-core machine): the same
# RouterArgs parsing, validation and Rust ``Router.from_args(...).start()`` as its ``main``.
LAUNCH = """
import argparse, sys
from sglang_router.router import Router
from sglang_router.router_args import RouterArgs
parser = argparse.ArgumentParser()
RouterArgs.add_cli_args(parser, use_router_prefix=False)
args = RouterArgs.from_cli_args(parser.parse_args(sys.argv[1:]), use_router_prefix=False)
args._validate_router_args()
Router.from_args(args).start()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Router:
    """One ``sglang_router.launch_router`` process on loopback (round robin, fast health checks)."""

    def __init__(self, worker_urls, log_path, api_key=None, port=None):
        self.url = f"http://127.0.0.1:{port or _free_port()}"
        argv = [sys.executable, "-c", LAUNCH, "--worker-urls", *worker_urls,
                "--host", "127.0.0.1", "--port", self.url.rsplit(":", 1)[1],
                "--policy", "round_robin", "--log-level", "info",
                "--health-check-interval-secs", "1", "--health-failure-threshold", "1",
                "--retry-initial-backoff-ms", "10", "--retry-max-backoff-ms", "100",
                # its Prometheus exporter binds 0.0.0.0:29000 by default: two routers collide
                "--prometheus-host", "127.0.0.1", "--prometheus-port", str(_free_port())]
        if api_key:
            argv += ["--api-key", api_key]
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.log_path = log_path
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT)

    def workers(self) -> dict[str, bool]:
        body = httpx.get(self.url + "/workers", headers=self.headers, timeout=2.0).json()
        return {w["url"]: w["is_healthy"] for w in body["workers"]}

    def wait_for(self, predicate, what: str, timeout_s: float = STARTUP_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                if predicate(self.workers()):
                    return
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            time.sleep(0.05)
        pytest.fail(f"router: {what} not reached (exit code {self.proc.poll()}); {self.explain()}")

    def explain(self) -> str:
        """The router's registry and log tail, for assertion messages."""
        self._log.flush()
        try:
            listed = self.workers()
        except (httpx.HTTPError, ValueError, KeyError) as e:
            listed = repr(e)
        lines = [ln for ln in open(self.log_path).read().splitlines()
                 if "processing request" not in ln]  # skip the per-request access lines
        return f"workers {listed}; log tail:\n" + "\n".join(lines[-40:])

    def stop(self) -> None:
        self.proc.kill()  # a graceful shutdown takes ~1 s and tests nothing here
        self.proc.wait()
        self._log.close()


@pytest.fixture
def fleet_behind_router(tmp_path):
    """``make(n, **fake_kw) -> (fakes, router)``: n fake workers and a router over them,
    returned once the router lists every worker healthy."""
    made, routers = [], []

    def make(n, api_key=None, **kw):
        fakes = [FakeSGLangServer(api_key=api_key, **kw) for _ in range(n)]
        made.extend(fakes)
        router = Router([f.url for f in fakes], tmp_path / f"router{len(routers)}.log", api_key)
        routers.append(router)
        router.wait_for(lambda w: len(w) == n and all(w.values()), f"{n} healthy workers")
        return fakes, router

    yield make
    for r in routers:
        r.stop()
    for f in made:
        f.stop()


def _cfg(fakes, router, **kw) -> SGLangFleetConfig:
    base = dict(
        server_urls=tuple(f.url for f in fakes), router_url=router.url, vocab_size=VOCAB,
        entropy_top_k=K, request_timeout_s=5.0, request_timeout_per_token_s=0.0,
        connect_timeout_s=1.0, control_timeout_s=10.0,
        max_attempts=5, backoff_initial_s=0.01, backoff_max_s=0.05, unhealthy_after=2,
        reprobe_interval_s=0.05, outage_wait_s=5.0, max_concurrency=4,
    )
    base.update(kw)
    return SGLangFleetConfig(**base)


def _weights(tmp_path, name: str, content: bytes) -> tuple[str, int]:
    path = tmp_path / name
    path.mkdir()
    (path / "model.safetensors").write_bytes(content)
    return str(path), dir_seed(str(path))


def _assert_versions_exact(prompts, results, seed_of_version, temperature):
    """Every token's logp_mu is the toy log-prob under the weights of its token_version."""
    for prompt, row in zip(prompts, results):
        for g in row:
            seq = list(prompt)
            for t, (tok, v) in enumerate(zip(g.response_ids.tolist(), g.token_version.tolist())):
                lp = toy_logprobs(seq[-1], seed_of_version[v], temperature)
                assert g.logp_mu[t] == pytest.approx(lp[tok], abs=1e-6), (prompt, t, v)
                others = [u for u in seed_of_version if u != v]
                for u in others:  # the check can tell the versions apart
                    wrong = toy_logprobs(seq[-1], seed_of_version[u], temperature)[tok]
                    assert abs(wrong - lp[tok]) > 1e-6
                seq.append(tok)
            assert np.all(np.diff(g.token_version) >= 0)


def _unit(rid: str) -> str:
    return re.sub(r"-\d+-a\d+$", "", rid)


def test_router_forwards_the_payload_and_weights_go_to_workers(fleet_behind_router, tmp_path):
    fakes, router = fleet_behind_router(2, api_key="s3cret")
    prompts = [[1, 2], [3], [4, 5, 6]]
    with SGLangFleet(_cfg(fakes, router, api_key="s3cret")) as fleet:
        before = fleet.generate(prompts, PARAMS, num_samples=2)
        path, seed1 = _weights(tmp_path, "w1", b"\x01\x02")
        fleet.update_weights_from_path(path, 1)
        after = fleet.generate(prompts, PARAMS, num_samples=2)
        m = fleet.metrics()
    # every /generate went through the router: round robin spread them over both workers,
    # each unit was answered exactly once, and each body arrived with every field the
    # client sent, unchanged (the router re-serialises requests and drops unknown fields)
    bodies = [b for f in fakes for b in f.generate_bodies]
    assert all(len(f.generate_bodies) >= 3 for f in fakes) and len(bodies) == 12
    assert set(collections.Counter(_unit(b["rid"]) for b in bodies).values()) == {1}
    for b in bodies:
        sent = build_generate_payload(b["input_ids"], PARAMS, b["sampling_params"]["max_new_tokens"],
                                      K, b["sampling_params"]["sampling_seed"], b["rid"])
        assert {k: b[k] for k in sent} == sent
    # weight pushes and their control calls went to each worker directly, with the key
    for f in fakes:
        routes = [r for r, _ in f.calls if r not in ("/health", "/server_info", "/get_server_info",
                                                     "/model_info", "/get_model_info")]
        assert routes == ["/pause_generation", "/update_weights_from_disk", "/continue_generation",
                          "/health_generate"]
        assert f.weight_version == "1" and set(f.auth_headers) <= {"Bearer s3cret", None}
    assert {int(v) for row in before for g in row for v in g.token_version} == {0}
    assert {int(v) for row in after for g in row for v in g.token_version} == {1}
    _assert_versions_exact(prompts, before + after, {0: 0, 1: seed1}, PARAMS.temperature)
    assert m["sglang/stale_replies"] == 0 and m["sglang/weight_update_failures"] == 0
    # a router that also routes to a worker the client does not push weights to is refused
    with SGLangFleet(_cfg(fakes[:1], router, api_key="s3cret")) as fleet:
        with pytest.raises(RuntimeError, match="not in SGLangFleetConfig.server_urls"):
            fleet.generate([[1]], PARAMS)


def test_router_kill_worker_mid_batch(fleet_behind_router, tmp_path):
    """A worker dies mid-batch while a weight update lands: no prompt is lost, every token's
    version is exact, the dead worker leaves the router and rejoins only once caught up."""
    fakes, router = fleet_behind_router(3, token_delay_s=0.02)
    prompts = [[i + 1] for i in range(6)]
    params = SamplingParams(temperature=1.0, max_new_tokens=10, seed=11)
    fakes[0].faults.extend([None, "die"])  # dies on its second request, its first in flight
    fakes[1].faults.append("stall")  # 5 tokens, then held until the update pauses fakes[1]
    path, seed1 = _weights(tmp_path, "w1", b"\x07")
    with SGLangFleet(_cfg(fakes, router)) as fleet:
        box = {}
        thread = threading.Thread(target=lambda: box.update(r=fleet.generate(prompts, params, 2)))
        thread.start()
        deadline = time.monotonic() + 30
        while not (fakes[0].dead and fakes[1].stalled.is_set()) and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.warns(UserWarning, match="weight push of version 1 failed on 1 of 3"):
            fleet.update_weights_from_path(path, 1)  # fails on the dead worker only
        thread.join(timeout=120)
        results = box["r"]
        m = fleet.metrics()
        # no prompt lost: every (prompt, sample) finished, none stuck at an abort
        assert [len(row) for row in results] == [2] * 6
        for row in results:
            for g in row:
                assert g.finish_reason == "length" and len(g.response_ids) == 10
        versions = [g.token_version.tolist() for row in results for g in row]
        assert [0] * 5 + [1] * 5 in versions  # the stalled sample: aborted, resumed on v1
        _assert_versions_exact(prompts, results, {0: 0, 1: seed1}, params.temperature)
        assert m["sglang/weight_update_failures"] == 1 and m["sglang/router_removals"] == 1
        assert m["sglang/aborts_resumed"] >= 1  # in-flight requests were aborted by the pause
        assert fakes[0].url not in router.workers()
        # the worker comes back with its startup weights: it rejoins the router only after
        # the client has loaded version 1 on it
        reborn = FakeSGLangServer(port=int(fakes[0].url.rsplit(":", 1)[1]))
        try:
            deadline = time.monotonic() + 30
            while fakes[0].url not in router.workers() and time.monotonic() < deadline:
                fleet.generate([[1]], SamplingParams(max_new_tokens=2))
                time.sleep(0.05)
            assert reborn.weight_version == "1" and reborn.weights_seed == seed1
            router.wait_for(lambda w: w.get(fakes[0].url) is True, "the reborn worker healthy")
            final = fleet.generate(prompts, params, 2)
            assert {int(v) for row in final for g in row for v in g.token_version} == {1}
            assert reborn.generate_bodies, router.explain()  # round robin reaches it again
            assert fleet.metrics()["sglang/router_additions"] >= 1
        finally:
            reborn.stop()


def test_router_stale_worker_is_taken_out_and_caught_up(fleet_behind_router, tmp_path):
    """A worker restarts between pushes (startup weights, version "default"): the router
    keeps routing to it; its replies are labelled 0 (exact), the client notices them, takes
    the worker out of the router, loads version 1 on it and adds it back."""
    fakes, router = fleet_behind_router(2)
    path, seed1 = _weights(tmp_path, "w1", b"\x03")
    prompts = [[1, 2], [3], [4, 5, 6]]
    with SGLangFleet(_cfg(fakes, router)) as fleet:
        fleet.update_weights_from_path(path, 1)
        fakes[1].restart()
        first = fleet.generate(prompts, PARAMS, num_samples=2)
        assert {int(v) for row in first for g in row for v in g.token_version} == {0, 1}
        _assert_versions_exact(prompts, first, {0: 0, 1: seed1}, PARAMS.temperature)
        assert fleet.metrics()["sglang/stale_replies"] >= 1
        deadline = time.monotonic() + 30  # requests start the due re-probe (catch-up)
        while fakes[1].weight_version != "1" and time.monotonic() < deadline:
            fleet.generate([[1]], SamplingParams(max_new_tokens=1))
            time.sleep(0.05)
        assert fakes[1].weights_seed == seed1
        router.wait_for(lambda w: len(w) == 2 and all(w.values()), "both workers back")
        fakes[1].generate_bodies.clear()
        later = fleet.generate(prompts, PARAMS, num_samples=2)
        m = fleet.metrics()
    assert {int(v) for row in later for g in row for v in g.token_version} == {1}
    assert fakes[1].generate_bodies, router.explain()  # back in rotation
    assert m["sglang/router_removals"] == 1 and m["sglang/router_additions"] == 1



def test_router_death_is_survived_through_the_workers(fleet_behind_router, tmp_path):
    """The router dies between batches: the next batch goes to the workers directly (every
    sample complete, every token's version exact); once a router answers again on its URL
    the client takes it back and the requests go through it."""
    fakes, router = fleet_behind_router(2)
    prompts = [[1, 2], [3], [4, 5, 6]]
    with SGLangFleet(_cfg(fakes, router, reprobe_interval_s=0.2)) as fleet:
        fleet.generate(prompts, PARAMS, num_samples=2)
        assert fleet.metrics()["sglang/router_bypassed"] == 0
        router.stop()  # killed
        during = fleet.generate(prompts, PARAMS, num_samples=2)
        m = fleet.metrics()
        assert [len(row) for row in during] == [2] * 3
        _assert_versions_exact(prompts, during, {0: 0}, PARAMS.temperature)
        assert all(g.finish_reason in ("stop", "length") for row in during for g in row)
        assert m["sglang/router_marked_unhealthy"] == 1 and m["sglang/router_unhealthy"] == 1
        assert m["sglang/router_bypassed"] >= 6 and m["sglang/servers_unhealthy"] == 0
        reborn = Router([f.url for f in fakes], tmp_path / "reborn.log",
                        port=int(router.url.rsplit(":", 1)[1]))
        try:
            reborn.wait_for(lambda w: len(w) == 2 and all(w.values()), "2 healthy workers")
            deadline = time.monotonic() + 30
            while not fleet.metrics()["sglang/router_recovered"] and time.monotonic() < deadline:
                fleet.generate([[1]], SamplingParams(max_new_tokens=1))
                time.sleep(0.05)
            bypassed = fleet.metrics()["sglang/router_bypassed"]
            after = fleet.generate(prompts, PARAMS, num_samples=2)
            m = fleet.metrics()
        finally:
            reborn.stop()
    _assert_versions_exact(prompts, after, {0: 0}, PARAMS.temperature)
    assert m["sglang/router_recovered"] == 1 and m["sglang/router_unhealthy"] == 0
    assert m["sglang/router_bypassed"] == bypassed  # back through the router
