"""SGLang fleet client against fault-injecting fake servers on loopback (no GPU, no sglang)."""

from __future__ import annotations

import collections
import json
import math
import os
import re
import time

import numpy as np
import pytest

from entr_jax.interfaces import Sampler, SamplingParams
from samplers.sglang_config import SGLangFleetConfig
from samplers.sglang_entropy import topk_entropy_bounds
from samplers.sglang_fleet import SGLangFleet
from samplers.sglang_launch import (
    SGLangLaunchConfig, all_commands, main, router_url, server_urls, write_key_file)
from samplers.sglang_protocol import build_generate_payload, parse_weight_version
from samplers.sglang_routing import WeightSyncError
from tests.sglang_fake_server import (
    K, PROMPTS, VOCAB, FakeSGLangServer, fleet_config as _cfg, sampling_params, toy_logprobs)

PARAMS = sampling_params()


def _tokens(results):
    return [[g.response_ids.tolist() for g in row] for row in results]


def _unit_of(rid: str) -> str:
    return re.sub(r"-\d+-a\d+$", "", rid)


def _assert_exactly_once(results, fakes, segments_per_unit=1):
    assert [len(row) for row in results] == [2] * len(PROMPTS)
    ok = collections.Counter(_unit_of(r) for f in fakes for r in f.ok_replies())
    assert len(ok) == 2 * len(PROMPTS)
    assert set(ok.values()) == {segments_per_unit}


# ---------------------------------------------------------------- entropy estimator
def test_entropy_bounds_golden():
    p = np.array([0.5, 0.25, 0.15, 0.10])
    h = lambda x: -x * math.log(x)  # noqa: E731
    est, lo, hi = topk_entropy_bounds(np.log(p[None, :2]), vocab_size=4)
    # tail mass 0.25 over 2 tokens, each <= 0.25: min = one token of 0.25, max = uniform.
    assert lo[0] == pytest.approx(h(0.5) + 2 * h(0.25), abs=1e-12)
    assert hi[0] == pytest.approx(h(0.5) + h(0.25) + 2 * h(0.125), abs=1e-12)
    exact = sum(h(x) for x in p)
    assert lo[0] < exact < hi[0]
    assert est[0] == pytest.approx((lo[0] + hi[0]) / 2, abs=1e-12)


@pytest.mark.parametrize("vocab,k,scale", [(50, 1, 0.5), (50, 5, 3.0), (300, 20, 1.0), (30, 29, 6.0)])
def test_entropy_bounds_contain_exact_entropy(vocab, k, scale):
    rng = np.random.default_rng(vocab + k)
    logits = rng.normal(0.0, scale, (200, vocab))
    logits[:20] = 0.0  # uniform rows: the tail bound is attained
    lp = logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)
    exact = -(np.exp(lp) * lp).sum(axis=1)
    top = -np.sort(-lp, axis=1)[:, :k]
    rng.permuted(top, axis=1, out=top)  # any order
    est, lo, hi = topk_entropy_bounds(top, vocab)
    assert np.all(lo <= exact + 1e-9) and np.all(exact <= hi + 1e-9)
    assert np.all(np.abs(est - exact) <= (hi - lo) / 2 + 1e-9)
    np.testing.assert_allclose(hi[:20], exact[:20], atol=1e-9)


def test_entropy_bounds_missing_rows():
    rows = np.array([[np.nan, np.nan], [math.log(0.9), -np.inf]])
    est, lo, hi = topk_entropy_bounds(rows, vocab_size=5)
    assert np.isnan(est[0]) and np.isfinite(est[1])
    with pytest.raises(ValueError, match="vocab_size"):
        topk_entropy_bounds(rows, vocab_size=2)


# ---------------------------------------------------------------- config / wire format
@pytest.mark.parametrize("kw,field", [
    (dict(server_urls=()), "server_urls"), (dict(server_urls=("ftp://x:1",)), "server_urls"),
    (dict(entropy_top_k=0), "entropy_top_k"), (dict(request_timeout_s=0), "request_timeout_s"),
    (dict(max_attempts=0), "max_attempts"), (dict(api_key="a b"), "api_key"),
    (dict(export_fn=3), "export_fn"),
])
def test_config_validation_names_field(kw, field):
    with pytest.raises(ValueError, match=field):
        SGLangFleetConfig(**kw)


def test_router_url_validation():
    with pytest.raises(ValueError, match="router_url"):
        SGLangFleetConfig(server_urls=("http://127.0.0.1:1",), router_url="127.0.0.1:2")
    with pytest.raises(ValueError, match="router_url"):  # the router is not a worker
        SGLangFleetConfig(server_urls=("http://127.0.0.1:1",), router_url="http://127.0.0.1:1/")
    cfg = SGLangFleetConfig(server_urls=("http://127.0.0.1:1",), router_url="http://127.0.0.1:2/")
    assert cfg.router_url == "http://127.0.0.1:2"


def test_unreachable_router_is_named(servers):
    fakes = servers(1)
    port = fakes[0].url.rsplit(":", 1)[1]
    fakes[0].stop()  # a closed port stands in for a router that is not running
    with SGLangFleet(_cfg(fakes, server_urls=("http://127.0.0.1:1",),
                          router_url=f"http://127.0.0.1:{port}")) as fleet:
        with pytest.raises(RuntimeError, match="SGLangFleetConfig.router_url"):
            fleet.generate([[1]], PARAMS)


def test_run_config_router_url():
    from experiments.run.config import SamplerSpec

    spec = SamplerSpec(kind="sglang", server_urls=("http://127.0.0.1:1",),
                       router_url="http://127.0.0.1:2")
    assert spec.router_url == "http://127.0.0.1:2"
    for kw in (dict(router_url="127.0.0.1:2"), dict(kind="jax", router_url="http://127.0.0.1:2")):
        with pytest.raises(ValueError, match="sampler.router_url"):
            SamplerSpec(**{"kind": "sglang", "server_urls": ("http://127.0.0.1:1",), **kw})


def test_payload_is_explicit():
    body = build_generate_payload([7, 8], PARAMS, 4, K, 99, "r-0-a1")
    assert body["input_ids"] == [7, 8] and body["return_logprob"] is True
    assert body["logprob_start_len"] == -1 and body["top_logprobs_num"] == K
    assert body["sampling_params"] == {
        "temperature": 0.8, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "max_new_tokens": 4,
        "stop_token_ids": [0], "n": 1, "ignore_eos": False, "no_stop_trim": True,
        "skip_special_tokens": False, "sampling_seed": 99}


def test_weight_version_parsing():
    assert parse_weight_version("default", 3) == 3 and parse_weight_version("12", 0) == 12
    with pytest.raises(ValueError, match="weight_version"):
        parse_weight_version("v1-abc", 0)


def test_filters_refused(servers):
    with SGLangFleet(_cfg(servers(1))) as fleet:
        for kw in (dict(top_p=0.9), dict(top_k=5), dict(min_p=0.1), dict(top_k=1, top_p=0.5)):
            with pytest.raises(ValueError, match=next(iter(kw))):
                fleet.generate(PROMPTS, SamplingParams(**kw))


def test_greedy_is_sent_as_temperature_zero_and_ignores_the_seed(servers):
    """``top_k=1`` is greedy decoding: sent as temperature 0 with top_k 1 (SGLang's arg-max,
    the first of exact ties), so every seed gives the arg-max tokens of the toy model."""
    fakes = servers(1)
    with SGLangFleet(_cfg(fakes)) as fleet:
        runs = [fleet.generate([[3]], SamplingParams(temperature=0.7, top_k=1, max_new_tokens=5,
                                                     seed=seed))[0][0] for seed in range(4)]
    sp = fakes[0].generate_bodies[0]["sampling_params"]
    assert (sp["temperature"], sp["top_k"], sp["top_p"], sp["min_p"]) == (0.0, 1, 1.0, 0.0)
    seq, want = [3], []
    for _ in range(5):
        want.append(int(np.argmax(toy_logprobs(seq[-1], 0, 1.0))))
        seq.append(want[-1])
    assert all(g.response_ids.tolist() == want for g in runs)


# ---------------------------------------------------------------- sampling semantics
def test_generations_match_toy_model(servers, fleet_reference):
    fakes = servers(2)
    with SGLangFleet(_cfg(fakes)) as fleet:
        assert isinstance(fleet, Sampler)
        results = fleet.generate(PROMPTS, PARAMS, num_samples=2)
        assert fleet.metrics()["sglang/tokens"] == sum(len(g.response_ids) for r in results for g in r)
    assert _tokens(results) == _tokens(fleet_reference)
    for prompt, row in zip(PROMPTS, results):
        for g in row:
            seq = list(prompt)
            for t, tok in enumerate(g.response_ids.tolist()):
                lp = toy_logprobs(seq[-1], 0, PARAMS.temperature)
                assert g.logp_mu[t] == pytest.approx(lp[tok], abs=1e-6)
                exact = -(np.exp(lp) * lp).sum()
                _, lo, hi = topk_entropy_bounds(np.sort(lp)[::-1][None, :K], VOCAB)
                assert lo[0] - 1e-5 <= g.entropy_mu[t] <= hi[0] + 1e-5
                assert abs(g.entropy_mu[t] - exact) <= (hi[0] - lo[0]) / 2 + 1e-5
                seq.append(tok)
            assert g.token_version.tolist() == [0] * len(g.response_ids)
            if g.finish_reason == "stop":
                assert g.response_ids[-1] == 0
            else:
                assert g.finish_reason == "length" and len(g.response_ids) == PARAMS.max_new_tokens
            assert g.prompt_ids.tolist() == prompt
    _assert_exactly_once(results, fakes)


def test_entropy_provenance_is_counted(servers):
    """Every token's entropy is either the engine's (exact) or the top-k estimate; the
    fleet counts the estimated ones (issue 11, item 10a)."""
    with SGLangFleet(_cfg(servers(1))) as fleet:
        results = fleet.generate(PROMPTS, PARAMS, num_samples=2)
        m = fleet.metrics()
    n = sum(len(g.response_ids) for row in results for g in row)
    assert n > 0 and m["sglang/tokens_entropy_estimated"] == m["sglang/tokens"] == n
    engine = servers(1)
    engine[0].engine_entropy = True
    with SGLangFleet(_cfg(engine)) as fleet:
        results = fleet.generate(PROMPTS, PARAMS, num_samples=2)
        m = fleet.metrics()
    assert m["sglang/tokens_entropy_estimated"] == 0 and m["sglang/tokens"] > 0
    assert m["sglang/entropy_halfwidth_mean"] == 0.0
    for prompt, row in zip(PROMPTS, results):
        for g in row:
            seq = list(prompt)
            for t, tok in enumerate(g.response_ids.tolist()):
                lp = toy_logprobs(seq[-1], 0, PARAMS.temperature)
                assert g.entropy_mu[t] == pytest.approx(-(np.exp(lp) * lp).sum(), abs=1e-5)
                seq.append(tok)


# Measured error of the top-k midpoint estimate at Qwen2's V = 151,936 and K = 20 (the
# table in docs/sglang.md section 4): logits sigma * N(0, 1) (seed 0) and Zipf p ~ r^-a.
ESTIMATOR_TABLE = [  # (family, parameter, H, estimate - H, half-width), nats
    ("gauss", 0.5, 11.806, -0.745, 0.869), ("gauss", 1.0, 11.428, -1.117, 1.609),
    ("gauss", 2.0, 9.879, -0.838, 2.596), ("gauss", 3.0, 7.272, 0.090, 2.485),
    ("gauss", 4.0, 4.426, 0.430, 1.430), ("gauss", 6.0, 1.326, 0.116, 0.199),
    ("zipf", 0.6, 11.391, -1.741, 2.188), ("zipf", 1.0, 8.211, -0.787, 2.403),
    ("zipf", 1.5, 3.179, 0.210, 0.692), ("zipf", 3.0, 0.679, 0.003, 0.005),
]


def test_entropy_estimator_error_at_qwen2_vocabulary():
    vocab, k = 151_936, 20
    g = np.random.default_rng(0).normal(0.0, 1.0, vocab)
    log_rank = np.log(np.arange(1, vocab + 1))
    for family, param, h_doc, bias_doc, half_doc in ESTIMATOR_TABLE:
        z = param * g if family == "gauss" else -param * log_rank
        lp = z - np.logaddexp.reduce(z)
        h = -(np.exp(lp) * lp).sum()
        est, lo, hi = topk_entropy_bounds(np.sort(lp)[::-1][None, :k], vocab)
        assert lo[0] <= h <= hi[0]  # the bound holds
        assert abs(est[0] - h) <= (hi[0] - lo[0]) / 2
        np.testing.assert_allclose([h, est[0] - h, (hi[0] - lo[0]) / 2],
                                   [h_doc, bias_doc, half_doc], atol=1e-3)


@pytest.mark.parametrize("fault,counter", [
    ("503", "http_errors"), ("drop", "connection_errors"), ("malformed_json", "malformed_responses"),
    ("hang", "timeouts"), ("die", "connection_errors"),
])
def test_faults_lose_and_duplicate_nothing(servers, fleet_reference, fault, counter):
    fakes = servers(2, hang_s=1.0)
    fakes[0].faults.extend([None, fault, fault])
    with SGLangFleet(_cfg(fakes)) as fleet:
        results = fleet.generate(PROMPTS, PARAMS, num_samples=2)
        m = fleet.metrics()
    assert _tokens(results) == _tokens(fleet_reference)
    for r, ref in zip(results, fleet_reference):
        for g, gr in zip(r, ref):
            np.testing.assert_array_equal(g.logp_mu, gr.logp_mu)
    _assert_exactly_once(results, fakes)
    assert m[f"sglang/{counter}"] >= 1 and m["sglang/retries"] >= 1
    if fault == "die":
        assert m["sglang/servers_marked_unhealthy"] >= 1


def test_malformed_tokens_are_counted_and_masked(servers, fleet_reference):
    fakes = servers(1)
    fakes[0].faults.extend(["null_logprob", "nan_logprob", "short_logprobs"])
    with SGLangFleet(_cfg(fakes, max_concurrency=1)) as fleet:
        results = fleet.generate(PROMPTS, PARAMS, num_samples=2)
        m = fleet.metrics()
    assert _tokens(results) == _tokens(fleet_reference)
    flat = [g for row in results for g in row]
    ref = [g for row in fleet_reference for g in row]
    # units run in order with one worker: fault i hits unit i
    assert np.isnan(flat[0].logp_mu[1]) and np.isnan(flat[1].logp_mu[1])
    assert np.isnan(flat[2].logp_mu[-2:]).all()
    n_bad = sum(int(np.isnan(g.logp_mu).sum()) for g in flat)
    assert n_bad == 4
    assert m["sglang/tokens_malformed_logprob"] == 1  # null (what orjson writes for NaN)
    assert m["sglang/tokens_nonfinite_logprob"] == 1  # a literal NaN
    assert m["sglang/tokens_missing_logprob"] == 2
    for g, gr in zip(flat, ref):  # every other token untouched
        ok = ~np.isnan(g.logp_mu)
        np.testing.assert_array_equal(g.logp_mu[ok], gr.logp_mu[ok])


def test_unknown_tail_is_dropped_and_resampled(servers, fleet_reference):
    fakes = servers(1)
    fakes[0].faults.append("short_no_ids")
    with SGLangFleet(_cfg(fakes, max_concurrency=1)) as fleet:
        results = fleet.generate(PROMPTS, PARAMS, num_samples=2)
        m = fleet.metrics()
    assert _tokens(results) == _tokens(fleet_reference)
    assert all(np.isfinite(g.logp_mu).all() for row in results for g in row)
    assert m["sglang/tokens_dropped"] == 2 and m["sglang/aborts_resumed"] == 1


def test_abort_resume_concatenates_segments_and_versions(servers, fleet_reference):
    fakes = servers(1)
    fakes[0].faults.append("abort")
    fakes[0].on_abort = lambda: setattr(fakes[0], "weight_version", "7")
    with SGLangFleet(_cfg(fakes, max_concurrency=1)) as fleet:
        results = fleet.generate(PROMPTS, PARAMS, num_samples=2)
        assert fleet.metrics()["sglang/aborts_resumed"] == 1
    assert _tokens(results) == _tokens(fleet_reference)
    first = results[0][0]
    half = PARAMS.max_new_tokens // 2
    assert first.finish_reason == fleet_reference[0][0].finish_reason
    assert first.token_version.tolist() == [0] * half + [7] * (len(first.response_ids) - half)
    assert {int(v) for g in results[1] for v in g.token_version} == {7}


def test_abort_budget_exhausted_reports_abort(servers):
    fakes = servers(1)
    fakes[0].faults.extend(["abort"] * 3)
    params = SamplingParams(temperature=1.0, max_new_tokens=16, seed=1)
    with SGLangFleet(_cfg(fakes, max_resumes=1, max_concurrency=1)) as fleet:
        (g,), = fleet.generate([[2]], params)
    assert g.finish_reason == "abort" and len(g.response_ids) == 8 + 4


# ---------------------------------------------------------------- weights, control, auth
def _export(params, path):
    with open(os.path.join(path, "model.safetensors"), "wb") as f:
        f.write(np.asarray(params, np.float32).tobytes())


def _probe_entropy(fleet):
    (g,), = fleet.generate([[3]], SamplingParams(temperature=1.0, max_new_tokens=1))
    return float(g.entropy_mu[0]), int(g.token_version[0])


def test_weight_updates(servers, tmp_path):
    fakes = servers(2)
    with SGLangFleet(_cfg(fakes, export_dir=str(tmp_path), export_fn=_export, keep_exports=2)) as fleet:
        h0, v0 = _probe_entropy(fleet)
        fleet.update_weights([1.0, 2.0], 1)
        h1, v1 = _probe_entropy(fleet)
        fleet.update_weights([1.0, 2.0], 2)  # same weights again
        h2, v2 = _probe_entropy(fleet)
        fleet.update_weights([3.0, 2.0], 3)
        h3, v3 = _probe_entropy(fleet)
        assert (v0, v1, v2, v3) == (0, 1, 2, 3) and fleet.version == 3
        assert h1 == h2 and h0 != h1 and h3 != h2
        assert sorted(os.listdir(tmp_path)) == ["v2", "v3"]
        with pytest.raises(ValueError, match="lower"):
            fleet.update_weights_from_path(str(tmp_path / "v3"), 2)
    for f in fakes:
        routes = [r for r, _ in f.calls if r != "/get_model_info"]
        assert routes == ["/pause_generation", "/update_weights_from_disk", "/continue_generation",
                          "/health_generate"] * 3
        assert f.calls[0][1] == {"mode": "abort"}
        upd = [b for r, b in f.calls if r == "/update_weights_from_disk"]
        assert [b["weight_version"] for b in upd] == ["1", "2", "3"]
        assert upd[2]["model_path"] == str(tmp_path / "v3") and f.weight_version == "3"


def test_dead_server_catches_up_when_it_returns(servers, tmp_path):
    fakes = servers(2)
    (tmp_path / "w").mkdir()
    _export([5.0], str(tmp_path / "w"))
    port = int(fakes[0].url.rsplit(":", 1)[1])
    fakes[0].stop()
    with SGLangFleet(_cfg(fakes)) as fleet:
        with pytest.warns(UserWarning, match="weight push of version 4 failed on 1 of 2"):
            fleet.update_weights_from_path(str(tmp_path / "w"), 4)
        assert fleet.metrics()["sglang/weight_update_failures"] == 1
        reborn = FakeSGLangServer(port=port)  # restarted with its startup weights
        try:
            deadline = time.monotonic() + 5.0
            while (reborn.weight_version != "4" or not fleet.metrics()["sglang/servers_recovered"]) \
                    and time.monotonic() < deadline:
                fleet.generate([[1]], SamplingParams(max_new_tokens=2))
                time.sleep(0.05)
            assert reborn.weight_version == "4" and reborn.weights_seed != 0
            assert fleet.metrics()["sglang/servers_recovered"] >= 1
        finally:
            reborn.stop()


def test_restarted_server_is_taken_out_and_caught_up(servers, tmp_path):
    """A server that restarts between pushes (startup weights) answers with version 0 after
    version 3 was pushed everywhere: its reply is kept with its true version, the server
    leaves the rotation at once and rejoins with version 3 loaded."""
    fakes = servers(2)
    (tmp_path / "w").mkdir()
    _export([2.0], str(tmp_path / "w"))
    with SGLangFleet(_cfg(fakes, max_concurrency=1)) as fleet:
        fleet.update_weights_from_path(str(tmp_path / "w"), 3)
        fakes[0].restart()
        gens = [g for row in fleet.generate(PROMPTS, PARAMS, num_samples=2) for g in row]
        m = fleet.metrics()
        # one unit at a time, least outstanding picks fakes[0] while it is in rotation
        assert [int(g.token_version[0]) for g in gens] == [0, 3, 3, 3, 3, 3]
        assert m["sglang/stale_replies"] == 1 and m["sglang/servers_marked_unhealthy"] == 1
        deadline = time.monotonic() + 5.0
        while not fleet.metrics()["sglang/servers_recovered"] and time.monotonic() < deadline:
            fleet.generate([[1]], SamplingParams(max_new_tokens=1))
            time.sleep(0.02)
        assert fleet.metrics()["sglang/servers_recovered"] == 1
        assert fakes[0].weight_version == "3" and fakes[0].weights_seed == fakes[1].weights_seed != 0


def test_weight_update_fails_everywhere_raises(servers, tmp_path):
    fakes = servers(1)
    with SGLangFleet(_cfg(fakes, outage_wait_s=0.3)) as fleet:
        with pytest.raises(ValueError, match="not a directory"):
            fleet.update_weights_from_path(str(tmp_path / "missing"), 1)
        fakes[0].stop()
        with pytest.raises(WeightSyncError, match="no SGLang server took it within outage_wait_s"), \
                pytest.warns(UserWarning, match="weight push of version 1 reached no SGLang server"):
            fleet.update_weights_from_path(str(tmp_path), 1)


def test_pause_resume_broadcast(servers):
    fakes = servers(2)
    with SGLangFleet(_cfg(fakes)) as fleet:
        fleet.pause()
        assert all(f.paused for f in fakes)
        fleet.resume()
    for f in fakes:
        assert f.calls == [("/pause_generation", {"mode": "in_place"}), ("/continue_generation", {})]
        assert not f.paused


def test_api_key_header_sent(servers):
    fakes = servers(1, api_key="s3cret")
    with SGLangFleet(_cfg(fakes, api_key="s3cret")) as fleet:
        fleet.generate([[1]], SamplingParams(max_new_tokens=2))
    assert fakes[0].auth_headers and set(fakes[0].auth_headers) == {"Bearer s3cret"}
    with SGLangFleet(_cfg(fakes, api_key="wrong")) as fleet:
        with pytest.raises(RuntimeError, match="401"):
            fleet.generate([[1]], SamplingParams(max_new_tokens=2))


# ---------------------------------------------------------------- launch helper
def test_launch_commands(tmp_path, monkeypatch, capsys):
    """The key is read from where api_key says, written to a private file and read from
    there by every command: it is on no command line and in nothing printed."""
    key = "s3cret-launch-key"
    monkeypatch.setenv("ENTR_TEST_LAUNCH_KEY", key)
    cfg = SGLangLaunchConfig(model_path="/ckpt/m", gpu_ids=(0, 1, 2, 3), tp_size=2, base_port=31000,
                             api_key="env:ENTR_TEST_LAUNCH_KEY", router_port=32000,
                             secrets_dir=str(tmp_path / "secrets"))
    key_file = write_key_file(cfg)
    assert key_file == str(tmp_path / "secrets" / "sglang_api_key.json")
    assert json.loads(open(key_file).read()) == {"api_key": key}
    assert os.stat(key_file).st_mode & 0o777 == 0o600
    cmds = all_commands(cfg, key_file)
    assert [c.env for c in cmds] == [{"CUDA_VISIBLE_DEVICES": "0,1"}, {"CUDA_VISIBLE_DEVICES": "2,3"}, {}]
    assert list(cmds[1].argv) == [
        "python", "-m", "sglang.launch_server", "--model-path", "/ckpt/m", "--host", "127.0.0.1",
        "--port", "31001", "--tp-size", "2", "--dtype", "bfloat16", "--config", key_file]
    assert list(cmds[2].argv) == [
        "python", "-m", "samplers.sglang_launch", "router", "--key-file", key_file,
        "--worker-urls", "http://127.0.0.1:31000", "http://127.0.0.1:31001", "--host",
        "127.0.0.1", "--port", "32000", "--prometheus-host", "127.0.0.1", "--prometheus-port",
        "32001"]
    assert router_url(cfg) == "http://127.0.0.1:32000"
    assert main(["--model-path", "/ckpt/m", "--gpu-ids", "0", "--api-key",
                 "env:ENTR_TEST_LAUNCH_KEY", "--router-port", "32000", "--secrets-dir",
                 str(tmp_path / "printed")]) == 0
    printed = capsys.readouterr().out
    assert "--config" in printed and "router --key-file" in printed
    assert key not in printed and not [c for c in cmds if key in c.shell() + str(c.env)]
    no_key = all_commands(SGLangLaunchConfig(model_path="/m", router_port=32000))
    assert "--config" not in no_key[0].argv and no_key[1].argv[:3] == (
        "python", "-m", "sglang_router.launch_router")
    with pytest.raises(ValueError, match="router_metrics_port"):  # a server's port
        SGLangLaunchConfig(model_path="/m", base_port=31000, gpu_ids=(0, 1), router_port=30999)
    assert cmds[0].shell().startswith("CUDA_VISIBLE_DEVICES=0,1 python -m sglang.launch_server")
    assert server_urls(cfg) == ("http://127.0.0.1:31000", "http://127.0.0.1:31001")
    with pytest.raises(ValueError, match="api_key"):
        SGLangLaunchConfig(model_path="/m", host="0.0.0.0")
    with pytest.raises(ValueError, match="api_key must say where the API key is read from") as e:
        SGLangLaunchConfig(model_path="/m", api_key=key)  # a literal key: refused, not echoed
    assert key not in str(e.value)
    with pytest.raises(ValueError, match="tp_size"):
        SGLangLaunchConfig(model_path="/m", gpu_ids=(0, 1, 2), tp_size=2)
    with pytest.raises(ValueError, match="float16"):
        SGLangLaunchConfig(model_path="/m", dtype="auto")


def test_launch_on_cpu_carries_several_flags_and_the_dtype(tmp_path, capsys, monkeypatch):
    """``--extra-args`` takes one string of several SGLang flags (and may repeat; a bare
    ``--`` passes the rest on); the dtype is always explicit (bfloat16, never SGLang's
    auto, which serves a float32 export as float16); ``--device cpu`` sets no GPUs and the
    attention backend 0.5.23 needs there; the interpreter is ``$ENTR_SGLANG_PYTHON``; an
    existing secrets folder is made private."""
    monkeypatch.setenv("ENTR_SGLANG_PYTHON", "/opt/sgl/bin/python")
    monkeypatch.setenv("ENTR_TEST_LAUNCH_KEY", "k3y")
    secrets = tmp_path / "secrets"
    secrets.mkdir(mode=0o755)
    os.chmod(secrets, 0o755)
    assert main(["--model-path", "/ckpt/m", "--device", "cpu", "--gpu-ids", "0", "1",
                 "--extra-args", "--max-total-tokens 4096 --disable-overlap-schedule",
                 "--api-key", "env:ENTR_TEST_LAUNCH_KEY", "--secrets-dir", str(secrets),
                 "--extra-args=--mem-fraction-static 0.2", "--", "--log-level", "debug"]) == 0
    lines = capsys.readouterr().out.splitlines()
    key_file = str(secrets / "sglang_api_key.json")
    assert lines[1] == (
        "SGLANG_USE_CPU_ENGINE=1 /opt/sgl/bin/python -m sglang.launch_server --model-path /ckpt/m --host 127.0.0.1 "
        f"--port 30001 --tp-size 1 --dtype bfloat16 --device cpu --attention-backend torch_native "
        f"--config {key_file} --max-total-tokens 4096 --disable-overlap-schedule "
        "--mem-fraction-static 0.2 --log-level debug")
    assert os.stat(secrets).st_mode & 0o777 == 0o700
    cfg = SGLangLaunchConfig(model_path="/m", device="cpu", dtype="float16",
                             extra_args=("--attention-backend", "intel_amx"))
    (cmd,) = all_commands(cfg)
    assert cmd.env == {"SGLANG_USE_CPU_ENGINE": "1"} and cmd.argv.count("--attention-backend") == 1
    assert cmd.argv[cmd.argv.index("--dtype") + 1] == "float16"
    with pytest.raises(SystemExit, match="--extra-args needs a value"):
        main(["--model-path", "/m", "--extra-args"])


def test_sigterm_to_launch_run_stops_every_server_process(tmp_path):
    """``sglang_launch --run`` killed with SIGTERM stops each server and the processes the
    server started (SGLang forks its scheduler): no orphan is left."""
    import signal
    import subprocess
    import sys

    fake = tmp_path / "fake_python"
    fake.write_text("#!/bin/sh\nsleep 600 &\necho $$ $! >> " + str(tmp_path / "pids") +
                    "\nwait\n")
    fake.chmod(0o755)
    launcher = subprocess.Popen(
        [sys.executable, "-m", "samplers.sglang_launch", "--model-path", "/m", "--device", "cpu",
         "--gpu-ids", "0", "1", "--python", str(fake), "--run"],
        stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": os.getcwd()})
    deadline = time.monotonic() + 60
    pids_file = tmp_path / "pids"
    while time.monotonic() < deadline and (
            not pids_file.exists() or len(pids_file.read_text().split()) < 4):
        time.sleep(0.1)
    pids = [int(p) for p in pids_file.read_text().split()]
    assert len(pids) == 4  # two servers, each with a child
    launcher.send_signal(signal.SIGTERM)
    assert launcher.wait(timeout=60) == 130

    def alive(pid):
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().split(")")[1].split()[0] != "Z"
        except FileNotFoundError:
            return False

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    assert [p for p in pids if alive(p)] == []


def test_the_router_entry_sets_the_key_from_its_file(tmp_path, monkeypatch):
    import sglang_router.launch_router as lr

    started = []
    monkeypatch.setattr(lr, "launch_router", started.append)
    key_file = tmp_path / "k.json"
    key_file.write_text(json.dumps({"api_key": "s3cret"}))
    assert main(["router", "--key-file", str(key_file), "--worker-urls", "http://127.0.0.1:1",
                 "--port", "29000"]) == 0
    (args,) = started
    assert args.api_key == "s3cret" and args.worker_urls == ["http://127.0.0.1:1"]
    assert args.port == 29000
