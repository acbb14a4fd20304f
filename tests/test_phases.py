"""`experiments.run.phases.PhaseClock`: compile spans carved out of phases, counted once, and
a split that adds up to the total."""

import time

import jax
import jax.numpy as jnp
import pytest
from jax import monitoring

from experiments.run.phases import COMPILE_EVENTS, PhaseClock, _union_length, format_split

TRACE, LOWER, BACKEND = COMPILE_EVENTS


def test_union_length_counts_overlaps_once_and_clips():
    spans = [(0.0, 2.0), (1.0, 3.0), (5.0, 6.0), (2.5, 2.75)]
    assert _union_length(spans, 0.5, 5.5) == pytest.approx(2.5 + 0.5)
    assert _union_length(spans, 0.0, 10.0) == pytest.approx(3.0 + 1.0)
    assert _union_length(spans, 3.0, 5.0) == 0.0
    assert _union_length([], 0.0, 1.0) == 0.0


def test_split_carves_compilation_out_of_phases_and_adds_up():
    clock = PhaseClock()
    clock.start()
    try:
        with clock.phase("sft"):
            t = time.time()
            # a trace with a nested lowering and a backend compile: 0.25 s of compilation
            monitoring.record_event_time_span(TRACE, t + 0.0, t + 0.125, fun_name="step")
            monitoring.record_event_time_span(LOWER, t + 0.0625, t + 0.125, fun_name="step")
            monitoring.record_event_time_span(BACKEND, t + 0.125, t + 0.25, fun_name="step")
            monitoring.record_event_time_span("/jax/other/event", t, t + 100.0)
            time.sleep(0.3)
        with clock.phase("eval"):
            time.sleep(0.01)
        t = time.time()
        time.sleep(0.6)
        monitoring.record_event_time_span(BACKEND, t, t + 0.5, fun_name="other")  # no phase
        clock.add("rl/sample_s", 1.5)
        clock.add("rl/sample_s", 0.25)
        clock.count("eval_episodes", 7)
    finally:
        clock.stop()
    total = time.time() - clock._t0 + 1.0  # > every span inside the clock's window
    split = clock.split(total)
    wall = split["wall"]
    assert wall["compile_s"] == pytest.approx(0.75)
    sft_span = clock._phase_spans["sft"][0]
    assert wall["sft_s"] == pytest.approx(sft_span[1] - sft_span[0] - 0.25)
    assert wall["rl_s"] == 0.0
    parts = wall["sft_s"] + wall["eval_s"] + wall["rl_s"] + wall["compile_s"] + wall["other_s"]
    assert parts == pytest.approx(total, abs=1e-9) and wall["total_s"] == total
    assert split["compiles"] == 2 and split["compiles_by_function"] == {"step": 1, "other": 1}
    assert split["sub"] == {"rl/sample_s": 1.75} and split["counts"] == {"eval_episodes": 7}
    assert set(split["cpu"]) == {"sft_s", "eval_s", "rl_s", "total_s"}
    # stopped: later compilations are not seen
    t = time.time()
    monitoring.record_event_time_span(BACKEND, t, t + 1.0, fun_name="late")
    assert clock.split(total)["compiles"] == 2
    assert format_split(wall, 2, 3.0).startswith(f"time {total:.0f} s = SFT ")


def test_real_jit_compilation_is_seen_once_per_cache_miss():
    clock = PhaseClock()
    clock.start()
    try:
        f = jax.jit(lambda x: jnp.sin(x) * 3.0)
        with clock.phase("eval"):
            f(jnp.ones(3)), f(jnp.ones(3)), f(jnp.ones(4))  # two shapes: two compilations
    finally:
        clock.stop()
    split = clock.split()
    assert split["compiles_by_function"]["jit(<lambda>)"] == 2
    assert split["wall"]["compile_s"] > 0.0


def test_resumed_clock_continues_the_saved_figures():
    first = PhaseClock()
    first.start()
    first.count("rl_episodes", 18)
    first.add("rl/learn_s", 2.0)
    saved = first.state_dict(10.0)
    first.stop()
    second = PhaseClock()
    second.load_state_dict(saved)
    second.start()
    second.count("rl_episodes", 6)
    second.stop()
    split = second.split(25.0)
    assert split["counts"] == {"rl_episodes": 24} and split["sub"] == {"rl/learn_s": 2.0}
    w = split["wall"]
    assert w["sft_s"] + w["eval_s"] + w["rl_s"] + w["compile_s"] + w["other_s"] == pytest.approx(25.0)



def test_figures_taken_inside_a_phase_count_it_so_far_and_a_resume_continues_them():
    """A checkpoint saves the clock inside the RL (or SFT) phase: that phase's time so far
    is in its figure, not in other_s, and the resumed clock adds to it."""
    first = PhaseClock()
    first.start()
    try:
        with first.phase("rl"):
            time.sleep(0.2)
            saved = first.state_dict()
        after = first.split()
    finally:
        first.stop()
    span = first._phase_spans["rl"][0]
    assert 0.2 <= saved["wall"]["rl_s"] <= span[1] - span[0]
    assert saved["wall"]["other_s"] < 0.1 and after["wall"]["rl_s"] >= saved["wall"]["rl_s"]
    second = PhaseClock()
    second.load_state_dict(saved)
    second.start()
    with second.phase("rl"):
        time.sleep(0.05)
    second.stop()
    assert second.split()["wall"]["rl_s"] >= saved["wall"]["rl_s"] + 0.05

def test_unknown_phase_is_refused():
    with pytest.raises(ValueError, match="unknown phase 'train'"):
        with PhaseClock().phase("train"):
            pass


def test_compile_cache_folder_choice(tmp_path):
    from experiments.run.compile_cache import enable

    before = jax.config.jax_compilation_cache_dir
    assert before is None or before == ""  # conftest: ENTR_JAX_CACHE=0, nothing configured
    try:
        assert enable({"ENTR_JAX_CACHE": "off"}) is None
        assert not jax.config.jax_compilation_cache_dir
        assert enable({"ENTR_JAX_CACHE": str(tmp_path)}) == str(tmp_path)
        assert jax.config.jax_compilation_cache_dir == str(tmp_path)
        # a folder already configured (e.g. JAX_COMPILATION_CACHE_DIR) is kept
        assert enable({"ENTR_JAX_CACHE": str(tmp_path / "other")}) == str(tmp_path)
    finally:
        jax.config.update("jax_compilation_cache_dir", before)


_CACHED_RUN = """
import jax, jax.numpy as jnp
from experiments.run.compile_cache import enable
from experiments.run.phases import PhaseClock
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
enable()
clock = PhaseClock()
clock.start()
jax.jit(lambda x: jnp.tanh(x) @ x.T)(jnp.ones((5, 5))).block_until_ready()
clock.stop()
print(clock.split()["counts"].get("compile_cache_hits", 0))
"""


def test_a_second_process_hits_the_compile_cache(tmp_path):
    """Two processes with the same cache folder: the second loads the executable the first
    compiled, and its clock counts the hit."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, ENTR_JAX_CACHE=str(tmp_path / "cache"))
    hits = [int(subprocess.run([sys.executable, "-c", _CACHED_RUN], env=env, check=True,
                               capture_output=True, text=True).stdout.split()[-1])
            for _ in range(2)]
    assert hits[0] == 0 and hits[1] >= 1
    assert any((tmp_path / "cache").iterdir())
