"""Answer extraction, the verifier (fast path, math-verify, time limit) and data agreement."""

import time

import pytest

import entr_jax.tasks.rewards as rewards
from entr_jax.data.sources import load_gsm8k, load_math500
from entr_jax.tasks.rewards import (
    MathScorer,
    MathVerifier,
    RewardConfig,
    VerifierConfig,
    extract_answer,
    last_boxed,
    math_reward,
    parse_plain_number,
)

# MATH-500 rows whose `answer` field math-verify does not judge equal to the \boxed{} of
# the row's own `solution`. Measured: none (500/500 agree), so the set is empty; a row
# appearing here later must be added with an explanation.
KNOWN_MATH500_DISAGREEMENTS: set[str] = set()


_REAL_CHECK = rewards._mv_check  # bound at import, in the test process and in workers


def _sleepy_check(gold, pred):
    """A check that never finishes in time (module-level so spawned workers import it)."""
    time.sleep(30)
    return True


def _slow_if_marked(gold, pred):
    """The real math-verify check, except that the answer "SLOW" never finishes in time."""
    if pred == "SLOW":
        time.sleep(60)
    return _REAL_CHECK(gold, pred)


@pytest.fixture(scope="module")
def verifier():
    with MathVerifier(VerifierConfig(timeout_s=20.0, num_workers=2)) as v:
        yield v


@pytest.mark.parametrize(
    "text, expected, method",
    [
        ("so \\boxed{\\frac{1}{\\sqrt{2}}} done", "\\frac{1}{\\sqrt{2}}", "boxed"),
        ("\\boxed{1} then \\boxed{\\{1,2\\}}", "\\{1,2\\}", "boxed"),
        ("Total: 5 apples\n#### 1,234.", "1,234", "hash"),
        ("#### $18", "18", "hash"),
        ("\\boxed{3} but finally\n#### 4", "4", "hash"),
        ("#### 4 ... no, \\boxed{5}", "5", "boxed"),
        ("x = 3 and y = -4.5 dollars", "-4.5", "last_number"),
        ("no answer here", None, "none"),
        ("\\boxed{unclosed", None, "none"),
    ],
)
def test_extract_answer(text, expected, method):
    got = extract_answer(text)
    assert (got.text, got.method) == (expected, method)


def test_extract_without_fallback():
    assert extract_answer("the answer is 7", fallback_last_number=False).text is None
    assert last_boxed("\\boxed{a{b}c}") == "a{b}c"


def test_parse_plain_number():
    assert parse_plain_number("1,234.50") * 2 == 2469
    assert parse_plain_number("025") == 25
    assert parse_plain_number("-3") == -3
    assert parse_plain_number("1/2") is None
    assert parse_plain_number("\\frac{1}{2}") is None
    assert parse_plain_number("1,23") is None  # not a thousands separator


def test_fast_path_needs_no_worker():
    v = MathVerifier()
    assert v.equivalent_batch([("24", "24.0"), ("1000", "1,000"), ("24", "25"), ("3", None)]) == [
        True, True, False, False,
    ]
    assert (v.num_fast_path, v._pool) == (3, None)


def test_equivalent_forms(verifier):
    pairs = [
        ("\\frac{14}{3}", "14/3"),
        ("\\frac{14}{3}", "4\\frac{2}{3}"),
        ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\pi/2)"),
        ("\\frac{14}{3}", "5"),
        ("\\frac{14}{3}", "\\frac{15}{3}"),
        ("2\\sqrt{2}", "\\sqrt{8}"),
        ("2\\sqrt{2}", "\\sqrt{2}"),
    ]
    assert verifier.equivalent_batch(pairs) == [True, True, True, False, False, True, False]


def test_works_off_the_main_thread(verifier):
    # math-verify's own signal-based timeouts fail off the main thread; ours do not.
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        got = pool.submit(verifier.equivalent_batch, [("\\frac{1}{2}", "0.5"), ("x^2", "x^3")])
        assert got.result() == [True, False]


def test_math_reward_format_term(verifier):
    cfg = RewardConfig(format_weight=0.1, fallback_last_number=True)
    assert math_reward("so \\boxed{24}", "24", verifier, cfg)[0] == pytest.approx(1.1)
    assert math_reward("I think 24", "24", verifier, cfg)[0] == pytest.approx(1.0)
    assert math_reward("#### 23", "24", verifier, cfg)[0] == pytest.approx(0.1)
    reward, info = MathScorer(verifier)("#### 24", {"answer": "24"})
    assert (reward, info["correct"], info["method"]) == (1.0, True, "hash")


def test_timeout_scores_zero_and_is_counted(monkeypatch):
    monkeypatch.setattr(rewards, "_mv_check", _sleepy_check)
    with MathVerifier(VerifierConfig(timeout_s=0.5, num_workers=1)) as v:
        assert v.equivalent_batch([("\\frac{1}{2}", "1/2"), ("7", "7")]) == [False, True]
        assert (v.num_timeouts, v.num_errors) == (1, 0)
        assert v._pool is not None  # the pool lives on; only the worker was replaced


def test_one_pathological_answer_times_out_alone(monkeypatch):
    """Issue 11 item 7: 2 workers, 5 s limit, one answer that never finishes among correct
    ones. Worker start-up is outside every answer's limit, the killed worker is replaced
    and nothing else fails: exactly one timeout per slow answer, every correct answer
    scored correct (before: the start-up ate the limit and 5 of 5 correct answers were
    scored wrong)."""
    monkeypatch.setattr(rewards, "_mv_check", _slow_if_marked)
    correct = [("\\frac{1}{2}", "1/2"), ("\\frac{14}{3}", "4\\frac{2}{3}"),
               ("2\\sqrt{2}", "\\sqrt{8}"), ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\pi/2)"),
               ("x^2+1", "1+x^2")]
    with MathVerifier(VerifierConfig(timeout_s=5.0, num_workers=2)) as v:
        got = v.equivalent_batch(correct[:1] + [("12", "SLOW")] + correct[1:])
        assert got == [True, False, True, True, True, True]
        assert (v.num_timeouts, v.num_errors) == (1, 0)
        pool = v._pool
        # the same pool (its slow worker replaced) goes on: one more slow answer, one more
        # timeout, the correct ones still correct
        assert v.equivalent_batch([("12", "SLOW")] + correct) == [False] + [True] * 5
        assert (v.num_timeouts, v.num_errors, v.num_checks) == (2, 0, 12)
        assert v._pool is pool


def test_config_validation():
    with pytest.raises(ValueError, match="timeout_s"):
        VerifierConfig(timeout_s=0)
    with pytest.raises(ValueError, match="format_weight"):
        RewardConfig(format_weight=-1)


def test_verifier_agrees_with_data(verifier):
    gsm = load_gsm8k("test")
    got = verifier.equivalent_batch(
        [(e["answer"], extract_answer(e["solution"]).text) for e in gsm]
    )
    gsm_rate = sum(got) / len(got)
    # Different values must be judged different: gold vs gold + 1.
    shifted = verifier.equivalent_batch(
        [(e["answer"], str(parse_plain_number(e["answer"]) + 1)) for e in gsm]
    )
    math = load_math500()
    got_math = verifier.equivalent_batch([(e["answer"], last_boxed(e["solution"])) for e in math])
    disagree = {e["id"] for e, ok in zip(math, got_math) if not ok}
    math_rate = sum(got_math) / len(got_math)
    print(f"\nverifier agreement: gsm8k test {gsm_rate:.4f} ({len(gsm)}), "
          f"math500 {math_rate:.4f} ({len(math)}); disagreements: {sorted(disagree)}")
    assert gsm_rate == 1.0 and not any(shifted)
    assert math_rate >= 0.998
    assert disagree == KNOWN_MATH500_DISAGREEMENTS
