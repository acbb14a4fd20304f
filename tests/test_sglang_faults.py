"""The SGLang fleet under faults (fake servers on loopback): replies that break the
contract in one field, outages of every server, servers that refuse requests, hung servers.
Every case checks what comes out against the fault-free reference batch, and the counters."""

from __future__ import annotations

import math
import threading
import time

import numpy as np
import pytest

from samplers.sglang_config import FleetPolicy
from samplers.sglang_entropy import topk_entropy_bounds
from samplers.sglang_fleet import SGLangFleet
from samplers.sglang_routing import FleetError
from tests.sglang_fake_server import (
    K, PROMPTS, VOCAB, fleet_config, generate_with, sampling_params, toy_logprobs)

PARAMS = sampling_params()


def _tokens(results):
    return [[g.response_ids.tolist() for g in row] for row in results]


def _flat(results):
    return [g for row in results for g in row]


# ---------------------------------------------------------------- one validation layer
# fault -> (counters it must set, index of the token whose logp_mu is masked, or None).
# One worker runs the units in order, so the fault hits the first unit (prompt 0, sample 0).
REPLY_FAULTS = {
    "oov_id": ({"tokens_invalid_id": 1, "tokens_dropped": 5, "aborts_resumed": 1}, None),
    "negative_id": ({"tokens_invalid_id": 1, "tokens_dropped": 5, "aborts_resumed": 1}, None),
    "positive_logprob": ({"tokens_invalid_logprob": 1}, 1),
    "huge_count": ({"malformed_responses": 1, "retries": 1}, None),
    "other_rid": ({"malformed_responses": 1, "retries": 1}, None),
    "prompt_mismatch": ({"malformed_responses": 1, "retries": 1}, None),
    "negative_version": ({"malformed_responses": 1, "retries": 1}, None),
    "bad_entropy": ({"tokens_invalid_entropy": 6, "tokens_entropy_estimated": 6}, None),
}


@pytest.mark.parametrize("fault", sorted(REPLY_FAULTS))
def test_a_reply_that_breaks_the_contract_is_cut_retried_or_masked(servers, fleet_reference, fault):
    """Every field of a reply is checked against the request and the model: the batch
    comes out as the fault-free one (a cut sample is resumed from its last valid token, a
    malformed reply retried), a bad log-prob is masked, and each fault is counted."""
    fakes = servers(1)
    fakes[0].faults.append(fault)
    results, m = generate_with(fakes, max_concurrency=1)
    counters, masked = REPLY_FAULTS[fault]
    assert _tokens(results) == _tokens(fleet_reference)
    first = _flat(results)[0]
    assert first.token_version.tolist() == [0] * len(first.response_ids)
    nan = [i for g in _flat(results) for i in np.flatnonzero(np.isnan(g.logp_mu))]
    assert nan == ([] if masked is None else [masked])
    for g, ref in zip(_flat(results), _flat(fleet_reference)):
        ok = ~np.isnan(g.logp_mu)
        np.testing.assert_array_equal(g.logp_mu[ok], ref.logp_mu[ok])
    assert fleet_reference[0][0].response_ids.size == 6  # the counts above are for 6 tokens
    watched = ("tokens_invalid_id", "tokens_dropped", "aborts_resumed", "tokens_invalid_logprob",
               "malformed_responses", "retries", "tokens_invalid_entropy")
    expected = {k: counters.get(k, 0) for k in watched}
    assert {k: m[f"sglang/{k}"] for k in watched} == expected
    if fault == "bad_entropy":  # the engine's values were refused: the top-k estimate instead
        g, seq = first, list(PROMPTS[0])
        for t, tok in enumerate(g.response_ids.tolist()):
            lp = toy_logprobs(seq[-1], 0, PARAMS.temperature)
            _, lo, hi = topk_entropy_bounds(np.sort(lp)[::-1][None, :K], VOCAB)
            assert lo[0] - 1e-5 <= g.entropy_mu[t] <= hi[0] + 1e-5
            seq.append(tok)


# ---------------------------------------------------------------- outages
def test_an_outage_of_every_server_is_waited_out_with_one_warning(servers, fleet_reference):
    """Both servers answer 503 to everything (health checks too) for 1 s, far longer than
    the retries last (4 tries, backoff <= 0.05 s): requests wait for a server to come back
    instead of failing, one warning says so, and the batch is the fault-free one."""
    fakes = servers(2)
    for f in fakes:
        f.unavailable = True
    cfg = fleet_config(fakes, max_attempts=4, reprobe_interval_s=0.2, outage_wait_s=10.0)

    def come_back():
        time.sleep(1.0)
        for f in fakes:
            f.unavailable = False

    thread = threading.Thread(target=come_back)
    thread.start()
    start = time.monotonic()
    with SGLangFleet(cfg) as fleet, pytest.warns(UserWarning) as caught:
        results = fleet.generate(PROMPTS, PARAMS, num_samples=2)
        m = fleet.metrics()
        # The batch may finish on the first server back before the other's re-probe is
        # due; more requests start the due re-probes, and both servers rejoin.
        deadline = time.monotonic() + 10.0
        while fleet.metrics()["sglang/servers_unhealthy"] and time.monotonic() < deadline:
            fleet.generate(PROMPTS[:1], PARAMS)
            time.sleep(0.05)
        after = fleet.metrics()
    thread.join()
    assert time.monotonic() - start >= 1.0
    assert _tokens(results) == _tokens(fleet_reference)
    outage = [w for w in caught if "no SGLang server is in rotation" in str(w.message)]
    assert len(outage) == 1
    assert (f"{fakes[0].url}: answered 503" in str(outage[0].message)
            and "requests wait up to 10 s (outage_wait_s)" in str(outage[0].message))
    assert m["sglang/outages"] == 1 and m["sglang/servers_marked_unhealthy"] == 2
    # every server taken out is either back or still out, whenever the counters are read
    assert m["sglang/servers_recovered"] >= 1
    assert m["sglang/servers_recovered"] + m["sglang/servers_unhealthy"] == 2
    assert after["sglang/servers_recovered"] == 2 and after["sglang/servers_unhealthy"] == 0
    assert after["sglang/servers_marked_unhealthy"] == 2 and after["sglang/outages"] == 1


def test_an_outage_longer_than_the_wait_names_every_server(servers):
    fakes = servers(2)
    for f in fakes:
        f.unavailable = True
    cfg = fleet_config(fakes, max_attempts=4, reprobe_interval_s=0.1, outage_wait_s=0.5)
    with SGLangFleet(cfg) as fleet, pytest.warns(UserWarning, match="no SGLang server"):
        with pytest.raises(FleetError) as err:
            fleet.generate([[1]], PARAMS)
    message = str(err.value)
    assert message.startswith("no SGLang server came back within outage_wait_s=0.5 s: ")
    for f in fakes:
        assert f"{f.url}: answered 503" in message
    assert message.endswith("Check the servers (docs/sglang.md) or raise "
                            "sampler.fleet.outage_wait_s")


def test_the_outage_wait_must_outlast_the_reprobe_interval():
    with pytest.raises(ValueError, match=r"FleetPolicy.outage_wait_s \(30.0\) must exceed "
                                         r"FleetPolicy.reprobe_interval_s \(30.0\)"):
        FleetPolicy(outage_wait_s=30.0, reprobe_interval_s=30.0)
    with pytest.raises(ValueError, match="SGLangFleetConfig.request_timeout_per_token_s"):
        fleet_config([], request_timeout_per_token_s=math.nan)


# ---------------------------------------------------------------- refusals
def test_a_server_that_refuses_the_key_is_routed_around(servers, fleet_reference):
    """One of two servers was started with another key: it answers 401 and leaves the
    rotation (a re-probe reads /get_model_info, which needs the key, so it stays out);
    every sample comes from the other server."""
    good, wrong_key = servers(1, api_key="s3cret") + servers(1, api_key="other")
    results, m = generate_with([wrong_key, good], api_key="s3cret")
    assert _tokens(results) == _tokens(fleet_reference)
    assert wrong_key.ok_replies() == [] and len(good.ok_replies()) == 6
    assert m["sglang/rejections"] >= 1 and m["sglang/servers_marked_unhealthy"] == 1
    assert m["sglang/servers_recovered"] == 0 and m["sglang/servers_unhealthy"] == 1


def test_a_request_one_server_refuses_goes_to_another(servers, fleet_reference):
    """A 400 is about the request on that server, not the server: the request goes to the
    other server, and the refusing one stays in rotation."""
    fakes = servers(2)
    fakes[0].faults.append("400")
    results, m = generate_with(fakes, max_concurrency=1)
    assert _tokens(results) == _tokens(fleet_reference)
    assert m["sglang/rejections"] == 1 and m["sglang/servers_marked_unhealthy"] == 0


def test_a_request_every_server_refuses_stops_naming_each_answer(servers):
    fakes = servers(2)
    for f in fakes:
        f.faults.append("400")
    with SGLangFleet(fleet_config(fakes, max_concurrency=1)) as fleet:
        with pytest.raises(FleetError) as err:
            fleet.generate([[1]], PARAMS)
        assert fleet.metrics()["sglang/servers_marked_unhealthy"] == 0
    message = str(err.value)
    assert message.startswith("every SGLang server rejected the request: ")
    for f in fakes:
        assert f'{f.url} answered 400: {{"error": {{"message": "fault 400"}}}}' in message
    assert "a 400 a request the server refuses (its answer says why)" in message


# ---------------------------------------------------------------- timeouts
def test_a_hung_server_is_given_up_after_the_budget_scaled_timeout(servers, fleet_reference):
    """A call may take request_timeout_s + request_timeout_per_token_s * max_new_tokens:
    0.1 + 0.05 * 6 = 0.4 s here, so a server hanging 1.5 s is given up on (and the unit
    answered by the other server) while one answering at once is not."""
    cfg = FleetPolicy(request_timeout_s=0.1, request_timeout_per_token_s=0.05)
    assert cfg.request_timeout(6) == pytest.approx(0.4)
    fakes = servers(2, hang_s=1.5)
    fakes[0].faults.append("hang")
    results, m = generate_with(fakes, request_timeout_s=0.1, request_timeout_per_token_s=0.05)
    assert _tokens(results) == _tokens(fleet_reference)
    assert m["sglang/timeouts"] == 1 and m["sglang/retries"] == 1
