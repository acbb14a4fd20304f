"""A fault-injecting stand-in for one SGLang server (test helper, loopback only).

It speaks the subset of SGLang's native HTTP API the fleet client uses, with SGLang's JSON
shapes: ``output_token_logprobs`` / ``output_top_logprobs`` as ``[logprob, id, null]``
triples, ``finish_reason`` dicts (``stop``+``matched``, ``length``+``length``,
``abort``+``message``), ``meta_info.completion_tokens``, a *string* ``weight_version``
(``"default"`` at start), ``output_ids``. Routes: ``POST /generate``,
``POST /update_weights_from_disk``, ``POST /pause_generation``,
``POST /continue_generation``, ``POST /abort_request``, ``GET /health_generate``,
``GET /get_model_info``.

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
``output_ids``), ``"abort"`` (stop after half the budget with ``finish_reason`` abort) and
``"die"`` (the server stops listening; this and every later request is dropped).
With ``engine_entropy = True`` replies also carry ``meta_info["output_token_entropy"]``
(the exact entropy per token), as a server patched to report it would.
"""

from __future__ import annotations

import collections
import hashlib
import http.server
import json
import os
import threading
import time

import numpy as np

VOCAB = 11


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

    def __init__(self, api_key: str | None = None, hang_s: float = 2.0, port: int = 0):
        self.api_key = api_key
        self.on_abort = None  # optional callable run after an "abort" reply is built
        self.hang_s = hang_s
        self.engine_entropy = False  # True: also report meta_info["output_token_entropy"]
        self.faults: collections.deque[str | None] = collections.deque()
        self.weights_seed = 0
        self.weight_version = "default"
        self.model_path = "/fake/initial"
        self.paused = False
        self.dead = False
        self.lock = threading.Lock()
        self.calls: list[tuple[str, dict]] = []  # (route, body) of control calls
        self.replies: list[tuple[str, str]] = []  # (rid, "ok" | fault) of /generate
        self.auth_headers: list[str | None] = []
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # keep test output quiet
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
        if self.api_key is not None and req.headers.get("Authorization") != f"Bearer {self.api_key}":
            return self._send(req, 401, {"error": "unauthorized"})
        body = json.loads(raw) if raw else {}
        route = (method, req.path)
        if route == ("POST", "/generate"):
            return self._generate(req, body)
        with self.lock:
            self.calls.append((req.path, body))
        if route == ("GET", "/health_generate"):
            return self._send(req, 200, None)
        if route == ("GET", "/get_model_info"):
            return self._send(req, 200, {
                "model_path": self.model_path, "tokenizer_path": self.model_path,
                "is_generation": True, "preferred_sampling_params": None,
                "weight_version": self.weight_version})
        if route == ("POST", "/pause_generation"):
            self.paused = True
            return self._send(req, 200, {"message": "Generation paused successfully.", "status": "ok"})
        if route == ("POST", "/continue_generation"):
            self.paused = False
            return self._send(req, 200, {"message": "Generation continued successfully.", "status": "ok"})
        if route == ("POST", "/abort_request"):
            return self._send(req, 200, None)
        if route == ("POST", "/update_weights_from_disk"):
            path = body.get("model_path")
            if not isinstance(path, str) or not os.path.isdir(path):
                return self._send(req, 400, {"success": False, "message": f"bad model_path {path!r}",
                                             "num_paused_requests": 0})
            self.weights_seed, self.model_path = dir_seed(path), path
            if body.get("weight_version") is not None:
                self.weight_version = body["weight_version"]
            return self._send(req, 200, {"success": True, "message": "Succeeded to update model weights.",
                                         "num_paused_requests": 0})
        return self._send(req, 404, {"detail": "Not Found"})

    def _send(self, req, status: int, obj, raw: bytes | None = None) -> None:
        data = raw if raw is not None else (b"" if obj is None else json.dumps(obj).encode())
        try:
            req.send_response(status)
            req.send_header("Content-Type", "application/json")
            req.send_header("Content-Length", str(len(data)))
            req.end_headers()
            req.wfile.write(data)
        except OSError:  # client gone (after a hang)
            pass

    # ------------------------------------------------------------------ /generate
    def _generate(self, req, body: dict) -> None:
        with self.lock:
            fault = self.faults.popleft() if self.faults else None
        rid = str(body.get("rid"))
        with self.lock:
            self.replies.append((rid, fault or "ok"))
        if fault == "die":
            self.dead = True
            threading.Thread(target=self.stop, daemon=True).start()
            req.close_connection = True
            return
        if fault == "drop":
            req.close_connection = True
            return
        if fault == "503":
            return self._send(req, 503, {"error": {"message": "Service Unavailable"}})
        if fault == "malformed_json":
            return self._send(req, 200, None, raw=b'{"text": "", "meta_info": {"finish_reason": ')
        if fault == "hang":
            time.sleep(self.hang_s)
        reply = self.sample(body, abort=fault == "abort")
        if fault == "abort" and self.on_abort is not None:
            self.on_abort()
        triples = reply["meta_info"]["output_token_logprobs"]
        if fault in ("null_logprob", "nan_logprob") and len(triples) > 1:
            triples[1][0] = None if fault == "null_logprob" else float("nan")
        if fault in ("short_logprobs", "short_no_ids"):
            del triples[-2:]
            if fault == "short_no_ids":
                del reply["output_ids"]
        self._send(req, 200, reply)

    def sample(self, body: dict, abort: bool = False) -> dict:
        """The toy model's reply to a ``/generate`` body (SGLang JSON shape)."""
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
            lp = toy_logprobs(ids[-1], self.weights_seed, temperature)
            pos = len(ids)
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
            "weight_version": self.weight_version, "completion_tokens": len(out), "cached_tokens": 0,
            "output_token_logprobs": triples,
        }
        if k:
            meta["output_top_logprobs"] = tops
        if self.engine_entropy:  # what a server patched to report the entropy would send
            meta["output_token_entropy"] = entropies
        return {"text": "", "output_ids": out, "meta_info": meta}
