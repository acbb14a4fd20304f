"""Weight pushes that fail (issue 45, section 3), against fake servers on loopback: every
server down when the run starts, both servers dying mid-run, every server answering 500 to
the push, a server that refuses it while the other takes it, and a reload that kills the
server. A push no server took is an outage, waited out as generation waits one out; a
server the caller started itself is relaunched on the new checkpoint; what cannot be
recovered raises `WeightSyncError` naming each server and its answer."""

from __future__ import annotations

import os
import threading
import time
import warnings

import numpy as np
import pytest

from entr_jax.interfaces import SamplingParams
from samplers.sglang_fleet import SGLangFleet
from samplers.sglang_routing import FleetError, WeightSyncError
from tests.sglang_fake_server import FakeSGLangServer, dir_seed, fleet_config

ONE = SamplingParams(temperature=1.0, max_new_tokens=3, seed=1)


@pytest.fixture
def checkpoint(tmp_path):
    """``make(name) -> path``: a directory whose files are the fake's "weights"."""
    def make(name: str) -> str:
        path = tmp_path / name
        path.mkdir()
        (path / "model.safetensors").write_bytes(name.encode() * 8)
        return str(path)
    return make


def _port(fake: FakeSGLangServer) -> int:
    return int(fake.url.rsplit(":", 1)[1])


def _serve_again(port: int) -> FakeSGLangServer:
    """A new server on ``port``, once a killed one there has let it go (a background
    thread of `FakeSGLangServer.kill` closes it)."""
    deadline = time.monotonic() + 10.0
    while True:
        try:
            return FakeSGLangServer(port=port)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _revive_in_outage(fleet, port: int, started: list) -> threading.Thread:
    """A server back on ``port``, with its startup weights, once ``fleet`` is waiting out
    a push that reached no server (polled; gives up after 10 s)."""
    def revive():
        deadline = time.monotonic() + 10.0
        while not fleet.metrics()["sglang/weight_sync_outages"] and time.monotonic() < deadline:
            time.sleep(0.01)
        started.append(_serve_again(port))

    thread = threading.Thread(target=revive, daemon=True)
    thread.start()
    return thread


def _versions(fleet) -> set[int]:
    gens = [g for row in fleet.generate([[1], [2]], ONE, num_samples=2) for g in row]
    return {int(v) for g in gens for v in g.token_version}


def _push(fleet, path, version):
    """``update_weights_from_path`` and the warnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fleet.update_weights_from_path(path, version)
    return [str(w.message) for w in caught]


def test_every_server_down_when_the_run_starts_is_waited_out(servers, checkpoint):
    """The first push (version 0) finds both servers down; one comes back meanwhile with
    its startup weights: the push waits for it, its re-probe loads version 0 (its
    "default" weights are not what was pushed), and sampling then serves version 0."""
    fakes = servers(2)
    ports = [_port(f) for f in fakes]
    for f in fakes:
        f.stop()
    revived: list = []
    path = checkpoint("v0")
    try:
        with SGLangFleet(fleet_config(fakes, outage_wait_s=5.0)) as fleet:
            timer = _revive_in_outage(fleet, ports[1], revived)
            said = _push(fleet, path, 0)
            assert revived[0].weight_version == "0" and revived[0].weights_seed == dir_seed(path)
            assert _versions(fleet) == {0}
            m = fleet.metrics()
    finally:
        timer.join()
        for r in revived:
            r.stop()
    assert len(said) == 1 and said[0].startswith("weight push of version 0 reached no SGLang server")
    assert all(f.url in said[0] for f in fakes) and "ConnectError" in said[0]
    assert (m["sglang/weight_sync_outages"], m["sglang/weight_sync_recovered"],
            m["sglang/weight_update_failures"], m["sglang/servers_unhealthy"]) == (1, 1, 2, 1)


def test_both_servers_dying_mid_run_and_staying_down_stops_naming_them(servers, checkpoint):
    """Version 1 is served; both servers die; the push of version 2 waits outage_wait_s,
    then raises a `WeightSyncError` (a `FleetError`: exit status 2 in a run) that names both
    servers and what they answered."""
    fakes = servers(2)
    with SGLangFleet(fleet_config(fakes, outage_wait_s=0.4, reprobe_interval_s=0.05)) as fleet:
        _push(fleet, checkpoint("v1"), 1)
        assert _versions(fleet) == {1}
        for f in fakes:
            f.kill()
        with pytest.raises(WeightSyncError) as err:
            _push(fleet, checkpoint("v2"), 2)
        m = fleet.metrics()
    text = str(err.value)
    assert isinstance(err.value, FleetError)
    assert text.startswith("weight push of version 2 failed: no SGLang server took it within "
                           "outage_wait_s=0.4 s. What they answered: ")
    assert all(text.count(f"{f.url} /pause_generation: ") == 1 for f in fakes)  # the push
    assert all(text.count(f.url) == 2 for f in fakes)  # and now
    assert text.endswith("Nothing was trained on weights the servers do not serve. Check the "
                         "servers (docs/sglang.md), then resume")
    assert (m["sglang/weight_sync_outages"], m["sglang/weight_sync_recovered"],
            m["sglang/weight_update_failures"]) == (1, 0, 2)


def test_both_servers_dying_mid_run_one_coming_back_gets_the_new_weights(servers, checkpoint):
    fakes = servers(2)
    with SGLangFleet(fleet_config(fakes, outage_wait_s=5.0)) as fleet:
        _push(fleet, checkpoint("v1"), 1)
        port = _port(fakes[0])
        for f in fakes:
            f.kill()
        revived: list = []
        timer = _revive_in_outage(fleet, port, revived)
        try:
            path = checkpoint("v2")
            _push(fleet, path, 2)
            assert _versions(fleet) == {2}
            assert revived[0].weight_version == "2" and revived[0].weights_seed == dir_seed(path)
        finally:
            timer.join()
            for r in revived:
                r.stop()
        m = fleet.metrics()
    assert (m["sglang/weight_sync_outages"], m["sglang/weight_sync_recovered"]) == (1, 1)


def test_every_server_answering_500_to_the_push_is_retried_then_named(servers, checkpoint):
    """"OOM while loading" from both: the re-probes push again; once on each server the
    fault passes and both serve the new weights. Answered every time, the push stops
    naming each server's 500."""
    fakes = servers(2)
    for f in fakes:
        f.update_faults.append("500")
    with SGLangFleet(fleet_config(fakes, outage_wait_s=5.0)) as fleet:
        said = _push(fleet, checkpoint("v1"), 1)
        assert _versions(fleet) == {1}
        m = fleet.metrics()
    assert "OOM while loading" in said[0] and "answered 500" in said[0] or "-> 500" in said[0]
    assert (m["sglang/weight_sync_outages"], m["sglang/weight_sync_recovered"],
            m["sglang/weight_update_failures"]) == (1, 1, 2)
    fakes = servers(2)
    for f in fakes:
        f.update_faults.extend(["500"] * 1000)
    with SGLangFleet(fleet_config(fakes, outage_wait_s=0.3, reprobe_interval_s=0.05)) as fleet:
        with pytest.raises(WeightSyncError) as err:
            _push(fleet, checkpoint("v2"), 2)
        assert fleet.version == 2  # nothing is served at it: the run stops here
    text = str(err.value)
    assert all(f"POST {f.url}/update_weights_from_disk -> 500" in text for f in fakes)
    assert text.count("OOM while loading") >= 2


@pytest.mark.parametrize("answer", ["401", "500", "503"])
def test_a_server_refusing_the_push_is_routed_around(servers, checkpoint, answer):
    """One server refuses the push, the other takes it: sampling goes on on the one that
    took it (every token is the new version), with a warning naming the one that refused;
    the refusing one rejoins only after its re-probe loaded the weights."""
    fakes = servers(2)
    fakes[0].update_faults.append(answer)
    with SGLangFleet(fleet_config(fakes, reprobe_interval_s=30.0, outage_wait_s=60.0)) as fleet:
        said = _push(fleet, checkpoint("v1"), 1)
        before = len(fakes[0].generate_bodies)
        assert _versions(fleet) == {1}
        assert len(fakes[0].generate_bodies) == before  # out of rotation
        m = fleet.metrics()
    assert len(said) == 1 and said[0].startswith(
        "weight push of version 1 failed on 1 of 2 SGLang servers (" + fakes[0].url)
    assert f"-> {answer}" in said[0] and fakes[1].url not in said[0]
    assert (m["sglang/weight_update_partial"], m["sglang/weight_update_failures"],
            m["sglang/servers_unhealthy"], m["sglang/weight_sync_outages"]) == (1, 1, 1, 0)


def test_a_reload_that_kills_the_server_relaunches_it_on_the_new_checkpoint(servers, checkpoint):
    """The reload kills the only server (SGLang's CPU path with qkv biases). The caller
    started it, so `relaunch` starts it again on the new checkpoint, tagged with the new
    version; no outage, and every token after the push is the new version."""
    fakes = servers(1)
    fakes[0].update_faults.append("die")
    port = _port(fakes[0])
    relaunched: list = []

    def relaunch(url, model_path, version):
        assert url == fakes[0].url
        server = _serve_again(port)
        server.load(model_path, str(version))
        relaunched.append(server)

    path = checkpoint("v1")
    try:
        with SGLangFleet(fleet_config(fakes, relaunch=relaunch)) as fleet:
            said = _push(fleet, path, 1)
            assert _versions(fleet) == {1}
            m = fleet.metrics()
    finally:
        for r in relaunched:
            r.stop()
    assert said == [] and relaunched[0].weights_seed == dir_seed(path)
    assert (m["sglang/servers_relaunched"], m["sglang/weight_update_failures"],
            m["sglang/weight_sync_outages"], m["sglang/servers_unhealthy"]) == (1, 1, 0, 0)


def test_a_reload_that_kills_a_server_nobody_relaunches_is_named(servers, checkpoint):
    """Without `relaunch` (servers the caller did not start), the killed server is an
    outage like any other; the error says the reload broke the connection."""
    fakes = servers(1)
    fakes[0].update_faults.append("die")
    with SGLangFleet(fleet_config(fakes, outage_wait_s=0.3, reprobe_interval_s=0.05)) as fleet:
        with pytest.raises(WeightSyncError) as err:
            _push(fleet, checkpoint("v1"), 1)
        m = fleet.metrics()
    assert f"{fakes[0].url} /update_weights_from_disk: RemoteProtocolError" in str(err.value)
    assert (m["sglang/servers_relaunched"], m["sglang/relaunch_failures"]) == (0, 0)


def test_a_relaunch_that_fails_is_named(servers, checkpoint):
    fakes = servers(1)
    fakes[0].update_faults.append("die")

    def relaunch(url, model_path, version):
        raise OSError("no such interpreter")

    with SGLangFleet(fleet_config(fakes, relaunch=relaunch, outage_wait_s=0.3,
                                  reprobe_interval_s=0.05)) as fleet:
        with pytest.raises(WeightSyncError, match="relaunch failed: OSError: no such interpreter"):
            _push(fleet, checkpoint("v1"), 1)
        assert fleet.metrics()["sglang/relaunch_failures"] == 1


def test_the_failed_push_is_not_retried_as_a_bug_by_the_run(tmp_path, capsys):
    """`entr-run` reports a `WeightSyncError` as one paragraph, exit status 2, ending with
    what is saved and the command that resumes the run."""
    from experiments.run import cli as run

    err = WeightSyncError("weight push of version 3 failed: no SGLang server took it within "
                          "outage_wait_s=1 s. What they answered: http://127.0.0.1:1 x")
    argv = ["quickstart", "--run_dir", str(tmp_path / "r"), "--sampler.kind", "sglang"]
    os.makedirs(tmp_path / "r")
    (tmp_path / "r" / "config.json").write_text("{}")  # the run had started: --resume holds
    assert run._fail(err, False, str(tmp_path / "r"), argv) == 2
    printed = capsys.readouterr().err.strip()
    assert printed.startswith("entr-run: error: weight push of version 3 failed: ")
    assert printed.endswith(f"no checkpoint yet, a resume starts over; resume with: entr-run "
                            f"quickstart --run_dir {tmp_path / 'r'} --sampler.kind sglang --resume")
    assert np.char.count(printed, "\n") == 0


def test_local_servers_relaunch_a_server_process_the_reload_killed(tmp_path, checkpoint):
    """`LocalServers` starts a fake server as a process of its own; the reload kills that
    process; the fleet relaunches it with ``--model-path`` the new checkpoint and
    ``--weight-version`` the new version, and samples from it."""
    import socket
    import sys

    from samplers.sglang_launch import LaunchCommand
    from samplers.sglang_procs import LocalServers

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    cmd = LaunchCommand(env={"PYTHONPATH": os.getcwd()}, argv=(
        sys.executable, "-m", "tests.sglang_fake_server", "--port", str(port), "--model-path",
        checkpoint("v0"), "--die-on-update"))
    path = checkpoint("v1")
    with LocalServers([cmd], [url], log_dir=str(tmp_path / "logs"), ready_timeout_s=60) as procs:
        procs.wait_ready()
        first = procs.procs[0]
        with SGLangFleet(fleet_config([type("S", (), {"url": url})()], control_timeout_s=30.0,
                                      relaunch=procs.relaunch)) as fleet:
            assert _push(fleet, path, 1) == []
            assert _versions(fleet) == {1}
            assert fleet.metrics()["sglang/servers_relaunched"] == 1
        assert first.poll() is not None and procs.procs[0].poll() is None
        argv = procs.commands[0].argv
        assert argv[argv.index("--model-path") + 1] == path
        assert argv[-2:] == ("--weight-version", "1")
    assert procs.procs[0].poll() is not None  # stopped on exit
