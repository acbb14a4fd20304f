"""pass@k / avg@n against closed forms computed by hand, and the JSON writer."""

import json
import math

import pytest

from entr_jax.evaluation import benchmark_metrics, evaluate, pass_at_k, write_eval_json


@pytest.mark.parametrize("n, c, k, expected", [
    (5, 0, 1, 0.0), (5, 5, 3, 1.0), (4, 1, 1, 0.25),
    (4, 1, 2, 1 - 3 / 6),        # 1 - C(3,2)/C(4,2)
    (5, 2, 2, 1 - 3 / 10),       # 1 - C(3,2)/C(5,2)
    (10, 3, 5, 1 - 21 / 252),    # 1 - C(7,5)/C(10,5)
    (4, 3, 2, 1.0),              # n - c < k
])
def test_pass_at_k_closed_form(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_large_n_is_stable():
    n, c, k = 1000, 7, 100
    exact = 1 - math.comb(n - c, k) / math.comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(exact, rel=1e-12)


def test_pass_at_k_errors():
    with pytest.raises(ValueError, match="c <= n"):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(3, 1, 4)


def test_benchmark_metrics_and_writer(tmp_path):
    correct = [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0]]
    m = benchmark_metrics(correct, ks=(1, 2), greedy=[True, False, False])
    assert m["avg@n"] == pytest.approx((0.25 + 0.5 + 0) / 3)
    assert m["pass@1"] == pytest.approx(m["avg@n"])
    assert m["pass@2"] == pytest.approx((0.5 + (1 - 1 / 6) + 0) / 3)
    assert (m["num_examples"], m["num_samples"], m["greedy"]) == (3, 12, pytest.approx(1 / 3))
    out = evaluate({"gsm8k": correct, "aime24": [[1]]}, ks=(1,))
    assert out["aime24"] == {"num_examples": 1, "num_samples": 1, "avg@n": 1.0, "pass@1": 1.0}
    path = tmp_path / "run" / "eval_step10.json"
    write_eval_json(path, out, step=10)
    assert json.loads(path.read_text()) == {"step": 10, "metrics": out}
    with pytest.raises(ValueError, match="greedy"):
        benchmark_metrics(correct, greedy=[True])
    with pytest.raises(ValueError, match="at least one sample"):
        benchmark_metrics([[]])
