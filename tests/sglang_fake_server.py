"""A fault-injecting stand-in for one SGLang server (test helper, loopback only).

It speaks the subset of SGLang's native HTTP API the fleet client uses, with SGLang's JSON
shapes: ``output_token_logprobs`` / ``output_top_logprobs`` as ``[logprob, id, null]``
triples, ``finish_reason`` dicts (``stop``+``matched``, ``length``+``length``,
``abort``+``message``), ``meta_info.completion_tokens``, a *string* ``weight_version``
(``"default"`` at start), ``output_ids``. Routes: ``POST /generate``,
``POST /update_weights_from_disk``, ``POST /pause_generation``,
``POST /continue_generation``, ``POST /abort_request``, ``GET /health``,
``GET /health_generate``, ``GET /get_model_info`` (alias ``/model_info``) and
``GET /get_server_info`` (alias ``/server_info``). ``sglang-router`` 0.3.2 registers a
worker only after ``GET /health`` answers 200, then reads ``/server_info`` and
``/model_info`` (falling back to the ``get_`` names on 404). As in SGLang, ``/health*`` and
``/metrics`` need no API key.

Weights, pause and abort behave as SGLang's do for the fleet client: a ``/generate``
request reads the loaded weights and ``weight_version`` once, atomically, so every token of
one reply comes from the weights the reply names; ``/pause_generation`` holds new requests
until ``/continue_generation``, and with ``mode="abort"`` (the default) ends requests in
flight at their next token with ``finish_reason`` abort. ``token_delay_s`` makes each
token take that long, so requests are in flight when a test pauses, updates or kills.

The "model" is a fixed categorical distribution per (last token, weights): logits drawn
from ``numpy.random.default_rng([weights_seed, last_token])``, tempered, log-softmaxed
(`toy_logprobs`), so log-probs and exact entropies are known to the tests. The weights seed
is a hash of the files of the loaded ``model_path`` (0 at start), so loading the same
files twice changes nothing. Token ``pos`` (absolute position in the sequence) is drawn
with ``default_rng([sampling_seed, pos])``: a resumed request continues exactly as an
uninterrupted one would.

Faults are queued per server (`FakeSGLangServer.faults`, one consumed per ``/generate``):
``"503"``, ``"hang"`` (sleep past the client timeout), ``"drop"`` (close the connection
without replying), ``"malformed_json"``, ``"null_logprob"`` (a NaN log-prob as SGLang's
orjson writes it: ``null``), ``"nan_logprob"`` (a JSON ``NaN``), ``"short_logprobs"`` (two
log-probs fewer than tokens, ``output_ids`` complete), ``"short_no_ids"`` (the same without
``output_ids``), ``"abort"`` (stop after half the budget with ``finish_reason`` abort),
``"stall"`` (after half the budget, wait for a ``/pause_generation`` with mode ``abort``,
which ends it as an abort; `FakeSGLangServer.stalled` is set while it waits) and
``"die"`` (`FakeSGLangServer.kill`: this request, those in flight and every later one are
dropped without a reply, and the port stops listening), ``"400"``/``"401"`` (that status,
with SGLang's error body) and replies that break the contract in one field:
``"oov_id"`` (token 1 is ``VOCAB + 5000`` in ``output_ids`` and its triple),
``"negative_id"`` (token 1 is -1), ``"positive_logprob"`` (token 1's log-prob is 0.7),
``"huge_count"`` (``completion_tokens`` 10**12), ``"other_rid"`` (``meta_info.id`` of
another request), ``"prompt_mismatch"`` (``prompt_tokens`` one more than the prompt),
``"bad_entropy"`` (``output_token_entropy`` of -1 and 1e6) and ``"negative_version"``
(``weight_version`` "-1"). While ``unavailable`` is set, every route answers 503 (an
outage: the server is up but serves nothing, health checks included).
``update_faults`` are queued the same way, one consumed per ``/update_weights_from_disk``:
``"401"``, ``"500"`` (``"OOM while loading"``) and ``"503"`` answer that status with
``success: false``; ``"die"`` kills the server during the reload, as SGLang's CPU path
does for a model with qkv biases (`FakeSGLangServer.kill`).
With ``engine_entropy = True`` replies also carry ``meta_info["output_token_entropy"]``
(the exact entropy per token), as a server patched to report it would.
"""

from __future__ import annotations

import collections
import hashlib
import http.server
import json
import os
import socket
import threading
import time

import numpy as np

VOCAB = 11


class _Killed(Exception):
    """The fake server was killed while a request was in flight."""


def toy_logprobs(last_token: int, weights_seed: int, temperature: float) -> np.ndarray:
    """``[VOCAB] float64`` log-probs of the next token (the sampled, tempered distribution)."""
    logits = np.random.default_rng([weights_seed, last_token]).normal(0.0, 2.0, VOCAB)
    z = logits / temperature
    return z - np.logaddexp.reduce(z)


def dir_seed(path: str) -> int:
    """Hash of the file names and contents of a directory (the toy's "weights")."""
    h = hashlib.sha256()
    for name in sorted(os.listdir(path)):
        h.update(name.encode())
        with open(os.path.join(path, name), "rb") as f:
            h.update(f.read())
    return int.from_bytes(h.digest()[:4], "little")


class FakeSGLangServer:
    """One fake server on ``127.0.0.1`` (random free port), served from a daemon thread."""

    def __init__(self, api_key: str | None = None, hang_s: float = 2.0, port: int = 0,
                 token_delay_s: float = 0.0, pause_wait_s: float = 10.0):
        self.api_key = api_key
        self.on_abort = None  # optional callable run after an "abort" reply is built
        self.hang_s = hang_s
        self.token_delay_s = token_delay_s
        self.pause_wait_s = pause_wait_s  # longest a request waits for /continue_generation
        self.engine_entropy = False  # True: also report meta_info["output_token_entropy"]
        self.faults: collections.deque[str | None] = collections.deque()
        self.update_faults: collections.deque[str | None] = collections.deque()
        self.weights_seed = 0
        self.weight_version = "default"
        self.model_path = "/fake/initial"
        self.paused = False
        self.dead = False
        self.unavailable = False  # every route answers 503
        self.lock = threading.Lock()
        self.state = threading.Condition()  # guards weights, version, pause, abort epoch
        self._abort_epoch = 0
        self.stalled = threading.Event()  # a "stall" request is waiting for a pause
        self.calls: list[tuple[str, dict]] = []  # (route, body) of control calls
        self.replies: list[tuple[str, str]] = []  # (rid, "ok" | fault | "killed") of /generate
        self.generate_bodies: list[dict] = []  # every /generate body, as received
        self.auth_headers: list[str | None] = []
        self._connections: set[socket.socket] = set()  # open client connections (keep-alive)
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # keep test output quiet
                pass

            def setup(self):
                super().setup()
                with fake.lock:
                    fake._connections.add(self.connection)

            def finish(self):
                with fake.lock:
                    fake._connections.discard(self.connection)
                try:
                    super().finish()
                except OSError:  # killed: the socket is already shut down
                    pass

            def do_GET(self):
                fake._handle(self, "GET")

            def do_POST(self):
                fake._handle(self, "POST")

        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._httpd.daemon_threads = True
        self._httpd.block_on_close = False
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop listening (idempotent)."""
        with self.lock:
            if self._httpd is None:
                return
            httpd, self._httpd = self._httpd, None
        httpd.shutdown()
        httpd.server_close()

    def ok_replies(self) -> list[str]:
        """rids answered without a fault."""
        with self.lock:
            return [rid for rid, kind in self.replies if kind == "ok"]

    # ------------------------------------------------------------------ plumbing
    def _handle(self, req, method: str) -> None:
        if self.dead:
            req.close_connection = True
            return
        length = int(req.headers.get("Content-Length") or 0)
        raw = req.rfile.read(length) if length else b""
        with self.lock:
            self.auth_headers.append(req.headers.get("Authorization"))
        if (self.api_key is not None and not req.path.startswith(("/health", "/metrics"))
                and req.headers.get("Authorization") != f"Bearer {self.api_key}"):
            return self._send(req, 401, {"error": "unauthorized"})
        if self.unavailable:
            return self._send(req, 503, {"error": {"message": "Service Unavailable"}})
        body = json.loads(raw) if raw else {}
        route = (method, req.path)
        if route == ("POST", "/generate"):
            return self._generate(req, body)
        with self.lock:
            self.calls.append((req.path, body))
        if route in (("GET", "/health_generate"), ("GET", "/health")):
            return self._send(req, 200, None)
        if route in (("GET", "/get_model_info"), ("GET", "/model_info")):
            return self._send(req, 200, {
                "model_path": self.model_path, "tokenizer_path": self.model_path,
                "is_generation": True, "preferred_sampling_params": None,
                "weight_version": self.weight_version})
        if route in (("GET", "/get_server_info"), ("GET", "/server_info")):
            return self._send(req, 200, {"model_path": self.model_path, "tp_size": 1, "dp_size": 1,
                                         "weight_version": self.weight_version, "version": "fake"})
        if route == ("POST", "/pause_generation"):
            with self.state:
                self.paused = True
                if body.get("mode", "abort") == "abort":
                    self._abort_epoch += 1
                    self.state.notify_all()
            return self._send(req, 200, {"message": "Generation paused successfully.", "status": "ok"})
        if route == ("POST", "/continue_generation"):
            with self.state:
                self.paused = False
                self.state.notify_all()
            return self._send(req, 200, {"message": "Generation continued successfully.", "status": "ok"})
        if route == ("POST", "/abort_request"):
            return self._send(req, 200, None)
        if route == ("POST", "/update_weights_from_disk"):
            with self.lock:
                fault = self.update_faults.popleft() if self.update_faults else None
            if fault == "die":  # the reload kills the server (SGLang's CPU path with biases)
                self.kill()
                req.close_connection = True
                return
            if fault in ("401", "500", "503"):
                return self._send(req, int(fault), {"success": False, "message": {
                    "401": "Unauthorized", "500": "OOM while loading",
                    "503": "Service Unavailable"}[fault], "num_paused_requests": 0})
            path = body.get("model_path")
            if not isinstance(path, str) or not os.path.isdir(path):
                return self._send(req, 400, {"success": False, "message": f"bad model_path {path!r}",
                                             "num_paused_requests": 0})
            seed = dir_seed(path)
            with self.state:
                self.weights_seed, self.model_path = seed, path
                if body.get("weight_version") is not None:
                    self.weight_version = body["weight_version"]
            return self._send(req, 200, {"success": True, "message": "Succeeded to update model weights.",
                                         "num_paused_requests": 0})
        return self._send(req, 404, {"detail": "Not Found"})

    def _send(self, req, status: int, obj, raw: bytes | None = None) -> bool:
        """Write one reply; False when the connection is gone (client left, server killed)."""
        data = raw if raw is not None else (b"" if obj is None else json.dumps(obj).encode())
        try:
            req.send_response(status)
            req.send_header("Content-Type", "application/json")
            req.send_header("Content-Length", str(len(data)))
            req.end_headers()
            req.wfile.write(data)
            req.wfile.flush()
            return True
        except OSError:
            return False

    # ------------------------------------------------------------------ /generate
    def _generate(self, req, body: dict) -> None:
        with self.lock:
            fault = self.faults.popleft() if self.faults else None
        rid = str(body.get("rid"))
        with self.lock:
            self.replies.append((rid, fault or "ok"))
            index = len(self.replies) - 1
            self.generate_bodies.append(body)
        if fault == "die":
            self.kill()
            req.close_connection = True
            return
        if fault == "drop":
            req.close_connection = True
            return
        if fault in ("503", "400", "401"):
            return self._send(req, int(fault), {"error": {"message": f"fault {fault}"}})
        if fault == "malformed_json":
            return self._send(req, 200, None, raw=b'{"text": "", "meta_info": {"finish_reason": ')
        if fault == "hang":
            time.sleep(self.hang_s)
        try:
            reply = self.sample(body, abort=fault == "abort", stall=fault == "stall")
        except _Killed:  # the server died while this request was in flight: no reply
            with self.lock:
                self.replies[index] = (rid, "killed")
            req.close_connection = True
            return
        if fault == "abort" and self.on_abort is not None:
            self.on_abort()
        triples = reply["meta_info"]["output_token_logprobs"]
        if fault in ("null_logprob", "nan_logprob") and len(triples) > 1:
            triples[1][0] = None if fault == "null_logprob" else float("nan")
        if fault in ("short_logprobs", "short_no_ids"):
            del triples[-2:]
            if fault == "short_no_ids":
                del reply["output_ids"]
        _break_contract(reply, fault)
        if not self._send(req, 200, reply):  # killed before the reply left
            with self.lock:
                self.replies[index] = (rid, "killed")

    def kill(self) -> None:
        """Die as a killed process does: every open connection (kept-alive ones included) is
        closed, requests in flight end without a reply, and the port stops listening."""
        self.dead = True
        with self.lock:
            connections = list(self._connections)
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        threading.Thread(target=self.stop, daemon=True).start()

    def load(self, path: str, version: str) -> None:
        """Serve the weights of ``path`` as ``version`` (a server started on them)."""
        with self.state:
            self.weights_seed, self.model_path, self.weight_version = dir_seed(path), path, version

    def restart(self) -> None:
        """Forget the loaded weights, as a restarted server does (startup weights, ``"default"``)."""
        with self.state:
            self.weights_seed, self.weight_version, self.model_path = 0, "default", "/fake/initial"

    def sample(self, body: dict, abort: bool = False, stall: bool = False) -> dict:
        """The toy model's reply to a ``/generate`` body (SGLang JSON shape)."""
        with self.state:  # wait out a pause, then read weights and version together
            self.state.wait_for(lambda: not self.paused, timeout=self.pause_wait_s)
            weights_seed, weight_version, epoch = self.weights_seed, self.weight_version, self._abort_epoch
        sp = body["sampling_params"]
        ids = list(body["input_ids"])
        temperature, budget = float(sp["temperature"]), int(sp["max_new_tokens"])
        stops = set(sp.get("stop_token_ids") or [])
        seed = int(sp.get("sampling_seed", 0))
        k = int(body.get("top_logprobs_num") or 0)
        limit = max(1, budget // 2) if abort else budget
        out, triples, tops, entropies = [], [], [], []
        finish = {"type": "length", "length": budget}
        while len(out) < limit:
            if stall and len(out) == max(1, budget // 2):
                with self.state:
                    self.stalled.set()
                    self.state.wait_for(lambda: self._abort_epoch != epoch, timeout=self.pause_wait_s)
                    self.stalled.clear()
            if self.token_delay_s:
                time.sleep(self.token_delay_s)
            if self.dead:
                raise _Killed
            if self._abort_epoch != epoch:  # paused with mode "abort": end here
                finish = {"type": "abort", "message": "Abort due to pause_generation", "status_code": 503}
                break
            pos = len(ids)
            if temperature < 1e-6:  # SGLang: greedy, the arg-max at temperature 1
                lp = toy_logprobs(ids[-1], weights_seed, 1.0)
                tok = int(np.argmax(lp))
            else:
                lp = toy_logprobs(ids[-1], weights_seed, temperature)
                tok = int(np.random.default_rng([seed, pos]).choice(VOCAB, p=np.exp(lp) / np.exp(lp).sum()))
            ids.append(tok)
            out.append(tok)
            triples.append([float(lp[tok]), tok, None])
            entropies.append(float(-(np.exp(lp) * lp).sum()))
            order = np.argsort(-lp, kind="stable")[:k]
            tops.append([[float(lp[j]), int(j), None] for j in order])
            if tok in stops:
                finish = {"type": "stop", "matched": tok}
                break
        if abort and finish["type"] == "length":
            finish = {"type": "abort", "message": "Abort in waiting queue", "status_code": 503}
        meta = {
            "id": body.get("rid"), "finish_reason": finish, "prompt_tokens": len(body["input_ids"]),
            "weight_version": weight_version, "completion_tokens": len(out), "cached_tokens": 0,
            "output_token_logprobs": triples,
        }
        if k:
            meta["output_top_logprobs"] = tops
        if self.engine_entropy:  # what a server patched to report the entropy would send
            meta["output_token_entropy"] = entropies
        return {"text": "", "output_ids": out, "meta_info": meta}


def _break_contract(reply: dict, fault: str | None) -> None:
    """Make ``reply`` break the ``/generate`` contract in the field ``fault`` names (module
    doc); other faults leave it as it is."""
    meta, ids = reply["meta_info"], reply.get("output_ids", [])
    if fault in ("oov_id", "negative_id") and len(ids) > 1:
        ids[1] = VOCAB + 5000 if fault == "oov_id" else -1
        meta["output_token_logprobs"][1][1] = ids[1]
    elif fault == "positive_logprob" and len(ids) > 1:
        meta["output_token_logprobs"][1][0] = 0.7
    elif fault == "huge_count":
        meta["completion_tokens"] = 10**12
    elif fault == "other_rid":
        meta["id"] = "another-request"
    elif fault == "prompt_mismatch":
        meta["prompt_tokens"] += 1
    elif fault == "bad_entropy":
        meta["output_token_entropy"] = [-1.0] + [1e6] * (len(ids) - 1)
    elif fault == "negative_version":
        meta["weight_version"] = "-1"


# ---------------------------------------------------------------- shared by the fleet tests
PROMPTS = [[1, 2], [3], [4, 5, 6]]
K = 4  # top log-probs per token


def sampling_params():
    """The sampling parameters of the fleet tests' batches."""
    from entr_jax.interfaces import SamplingParams

    return SamplingParams(temperature=0.8, max_new_tokens=6, stop_token_ids=(0,), seed=5)


def fleet_config(servers, **kw):
    """`SGLangFleetConfig` over fake ``servers`` with test-sized timeouts (``kw`` wins)."""
    from samplers.sglang_config import SGLangFleetConfig

    base = dict(
        server_urls=tuple(s.url for s in servers), vocab_size=VOCAB, entropy_top_k=K,
        request_timeout_s=0.5, request_timeout_per_token_s=0.0, connect_timeout_s=0.5,
        control_timeout_s=2.0, max_attempts=5, backoff_initial_s=0.01, backoff_max_s=0.05,
        unhealthy_after=2, reprobe_interval_s=0.05, outage_wait_s=5.0, max_concurrency=4,
    )
    base.update(kw)
    return SGLangFleetConfig(**base)


def generate_with(fakes, **cfg):
    """``(results, metrics)`` of one ``generate`` of `PROMPTS` x 2 samples by a fresh fleet
    over ``fakes`` (`fleet_config` with ``cfg``)."""
    from samplers.sglang_fleet import SGLangFleet

    with SGLangFleet(fleet_config(fakes, **cfg)) as fleet:
        return fleet.generate(PROMPTS, sampling_params(), num_samples=2), fleet.metrics()


def main(argv: list[str] | None = None) -> None:
    """``python -m tests.sglang_fake_server --port P [--model-path DIR] [--weight-version V]
    [--die-on-update]``: one fake server as a process of its own (as
    `samplers.sglang_procs.LocalServers` starts SGLang's), serving until killed;
    ``--die-on-update`` makes its first ``/update_weights_from_disk`` kill it."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model-path")
    parser.add_argument("--weight-version", default="default")
    parser.add_argument("--die-on-update", action="store_true")
    args = parser.parse_args(argv)
    server = FakeSGLangServer(port=args.port)
    if args.model_path:
        server.load(args.model_path, args.weight_version)
    if args.die_on_update:
        server.update_faults.append("die")
    while not server.dead:
        time.sleep(0.05)
    os._exit(1)  # as a killed server does


if __name__ == "__main__":
    main()
