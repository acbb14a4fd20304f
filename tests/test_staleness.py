"""Staleness schedule, delay line, parameter ring and measurements."""

import numpy as np
import pytest

from entr_jax import staleness as st


def _run_delay_line(cfg, steps):
    """Drive a DelayLine the way the loop does; return (n, generation version) pairs."""
    line = st.DelayLine(cfg)
    consumed = []
    for v in range(steps):
        for n in line.due(v):
            line.put(n, {"n": n, "made_at": v})
        batch = line.pop(v)
        assert batch["n"] == v
        consumed.append((v, batch["made_at"]))
        assert len(line) <= cfg.max_lag + 1
    return consumed


def test_fixed_lag_is_exact_after_warmup():
    cfg = st.StalenessConfig(mode="simulated", inter_lag=3)
    consumed = _run_delay_line(cfg, 20)
    lags = [v - g for v, g in consumed]
    assert lags == [0, 1, 2] + [3] * 17


def test_sync_is_lag_zero():
    cfg = st.StalenessConfig(mode="sync", inter_lag=5, max_inter_lag=9, intra_switches=1)
    assert [v - g for v, g in _run_delay_line(cfg, 10)] == [0] * 10
    assert st.intra_plan(cfg, 7) == (7, ())


@pytest.mark.parametrize("dist", ["uniform", "geometric"])
def test_random_lags_follow_the_configured_law(dist):
    cfg = st.StalenessConfig(
        mode="simulated", inter_distribution=dist, inter_lag=1, max_inter_lag=4,
        geometric_p=0.4, seed=3,
    )
    n_draws = 20000
    lags = np.array([st.inter_lag(cfg, n) for n in range(n_draws)])
    counts = np.bincount(lags, minlength=5)[1:5] / n_draws
    if dist == "uniform":
        expected = np.full(4, 0.25)
    else:
        w = 0.4 * 0.6 ** np.arange(4)
        expected = w / w.sum()
    # 4 sigma of a binomial proportion at n=20000 is < 0.013
    np.testing.assert_allclose(counts, expected, atol=0.013)
    # every batch is consumed exactly at min(n, k_n) staleness through the delay line
    consumed = _run_delay_line(cfg, 200)
    assert [v - g for v, g in consumed] == [min(v, st.inter_lag(cfg, v)) for v in range(200)]


def test_schedule_depends_only_on_seed_and_index():
    a = st.StalenessConfig(inter_distribution="uniform", max_inter_lag=9, seed=1)
    b = st.StalenessConfig(inter_distribution="uniform", max_inter_lag=9, seed=2)
    la = [st.inter_lag(a, n) for n in range(50)]
    assert la == [st.inter_lag(a, n) for n in range(50)]
    assert la != [st.inter_lag(b, n) for n in range(50)]


def test_intra_plan_spans_exactly_d_versions():
    cfg = st.StalenessConfig(inter_lag=2, intra_switches=3, ring_size=4, switch_window=8)
    first, steps = st.intra_plan(cfg, 10)  # generated at version 8
    assert first == 5 and len(steps) == 3
    assert list(steps) == sorted(set(steps)) and 1 <= steps[0] and steps[-1] <= 7
    # warm-up: generation version 1 can only span one switch
    first, steps = st.intra_plan(cfg, 3)
    assert (first, len(steps)) == (0, 1)


def test_delay_line_state_roundtrip_resumes_identically():
    cfg = st.StalenessConfig(inter_distribution="uniform", inter_lag=0, max_inter_lag=5, seed=7)
    full = _run_delay_line(cfg, 30)
    line = st.DelayLine(cfg)
    out = []
    for v in range(12):
        for n in line.due(v):
            line.put(n, {"n": n, "made_at": v})
        out.append((v, line.pop(v)["made_at"]))
    resumed = st.DelayLine(cfg)
    resumed.load_state_dict(line.state_dict())
    for v in range(12, 30):
        for n in resumed.due(v):
            resumed.put(n, {"n": n, "made_at": v})
        out.append((v, resumed.pop(v)["made_at"]))
    assert out == full


def test_param_ring_bounds_and_errors():
    ring = st.ParamRing(3)
    for v in range(5):
        ring.push(v, f"p{v}")
    assert ring.versions == [2, 3, 4] and ring.get(3) == "p3"
    with pytest.raises(KeyError, match="version 1"):
        ring.get(1)
    with pytest.raises(ValueError, match="increase"):
        ring.push(4, "again")


def test_trajectory_staleness():
    tv = np.array([3, 3, -1, 4, 5, -1])
    mask = np.array([1, 1, 0, 1, 1, 0], bool)
    assert st.trajectory_staleness(7, tv, mask) == (2, 2)
    assert st.trajectory_staleness(7, tv, np.zeros(6, bool)) == (0, 0)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"inter_lag": -1}, "inter_lag"),
        ({"inter_distribution": "uniform", "inter_lag": 3, "max_inter_lag": 2}, "max_inter_lag"),
        ({"intra_switches": 3, "ring_size": 3}, "intra_switches"),
        ({"intra_switches": 5, "switch_window": 5, "ring_size": 9}, "intra_switches"),
        ({"geometric_p": 0.0}, "geometric_p"),
        ({"mode": "later"}, "mode"),
    ],
)
def test_bad_config_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        st.StalenessConfig(**kwargs)
