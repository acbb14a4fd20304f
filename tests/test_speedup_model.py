"""The discrete-event async model on hand-computed timelines."""

import pytest

from experiments.multirun.speedup_model import model_table, simulate_async


def test_pipeline_with_a_loose_bound():
    # batches ready at 1, 2, 3; learner finishes 2, 3, 4
    assert simulate_async(3, 1, 1.0, 1.0, max_staleness=10) == 4.0


def test_bound_zero_serialises_sampling_and_learning():
    # b0: 0->1, learn ->2; b1 waits for version 1: 2->3, learn ->4; b2: 4->5 -> 6
    assert simulate_async(3, 1, 1.0, 1.0, max_staleness=0) == 6.0


def test_two_samplers_feed_a_fast_learner():
    # samplers finish batches at 2, 2, 4, 4; learner (0.5 s) ends at 2.5, 3, 4.5, 5
    assert simulate_async(4, 2, 2.0, 0.5, max_staleness=10) == 5.0


def test_model_table_matches_the_closed_form_in_steady_state():
    rows = model_table(c_s=1e-3, c_l=1e-3, tokens_per_batch=1000, steps=2000,
                       max_staleness=8, nodes=(1, 4))
    # N=1: sync = (1 + 1) / 2 = 1 s per step, async = max(1, 1) = 1 s -> ~1x
    # N=4: sync = 2 / 5 = 0.4 s, async = max(1/4, 1) = 1 s -> 0.4x (learner-bound)
    assert rows[0]["predicted_speedup"] == pytest.approx(1.0, rel=1e-2)
    assert rows[1]["predicted_speedup"] == pytest.approx(0.4, rel=1e-2)


def test_per_batch_costs_follow_the_long_batch():
    # generation 1, 3, 1 s; learning 1 s: b0 ready 1 -> learned 2; b1 ready 4 -> 5;
    # b2 ready 5 -> 6 (the long batch stalls the learner, the next one is ready at once)
    assert simulate_async(3, 1, [1.0, 3.0, 1.0], 1.0, max_staleness=10) == 6.0
    # constant costs given as lists are the scalar case
    assert simulate_async(3, 1, [1.0] * 3, [1.0] * 3, max_staleness=0) == 6.0
    with pytest.raises(ValueError, match="2 entries for 3 steps"):
        simulate_async(3, 1, [1.0, 2.0], 1.0, max_staleness=1)
