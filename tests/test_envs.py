"""Environments and the rollout runner with a byte-level fake tokenizer and scripted sampler."""

import numpy as np
import pytest

from entr_jax.data.templates import PromptTemplate
from entr_jax.interfaces import Sampler, SamplingParams
from entr_jax.tasks.arith import ArithLimits, ArithmeticError_, format_number, safe_eval
from entr_jax.tasks.calculator import make_calculator_env
from entr_jax.tasks.env import SingleTurnEnv, ToolEnv, parse_tool_call
from entr_jax.tasks.rewards import MathScorer, MathVerifier
from entr_jax.tasks.rollout import RolloutConfig, run_episodes, stop_cut
from entr_jax.types import BehaviorParams
from entr_jax.tasks.search import BM25Index, make_corpus, make_search_env, normalize_name
from entr_jax.types import Generation

EOS = 256


class ByteTokenizer:
    """Byte-level tokenizer: ids 0..255 are bytes, 256 is EOS."""

    eos_token_ids = (EOS,)

    def encode(self, text):
        return list(text.encode("utf-8"))

    def decode(self, ids):
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True):
        text = "".join(f"<|{m['role']}|>{m['content']}\n" for m in messages)
        text += "<|assistant|>" if add_generation_prompt else ""
        return self.encode(text) if tokenize else text


class ScriptedSampler:
    """Returns predetermined texts: ``script[call][i]`` for the i-th generation of a call.

    Every generation is the text's bytes followed by EOS, with logp_mu = -(j + 1) / 100,
    entropy_mu = 0.5 and token_version = 7.
    """

    def __init__(self, script):
        self.script = list(script)
        self.calls = []

    def generate(self, prompts, params, num_samples=1):
        texts = self.script[len(self.calls)]
        self.calls.append(([list(p) for p in prompts], params, num_samples))
        assert len(texts) == len(prompts) * num_samples
        out, k = [], 0
        for prompt in prompts:
            row = []
            for _ in range(num_samples):
                ids = list(texts[k].encode()) + [EOS]
                k += 1
                n = len(ids)
                row.append(Generation(
                    np.asarray(prompt, np.int32), np.asarray(ids, np.int32),
                    -(np.arange(n, dtype=np.float32) + 1) / 100, np.full(n, 0.5, np.float32),
                    np.full(n, 7, np.int32), "stop"))
            out.append(row)
        return out

    def update_weights(self, params, version):
        pass

    def pause(self):
        pass

    def resume(self):
        pass


TOK = ByteTokenizer()
EXAMPLE = {"id": "ex0", "question": "Natalia sold 48/2 clips. How many?", "answer": "24"}
PARAMS = SamplingParams(max_new_tokens=64, seed=3)


@pytest.fixture(scope="module")
def calc_factory():
    scorer = MathScorer(MathVerifier())  # numeric answers only: fast path, no worker pool

    def factory():
        return make_calculator_env(scorer)

    return factory


def run(script, factory, examples=(EXAMPLE,), num_samples=1, **cfg):
    sampler = ScriptedSampler(script)
    assert isinstance(sampler, Sampler)
    trajs = run_episodes(sampler, TOK, factory, list(examples), PARAMS, num_samples,
                         RolloutConfig(**cfg))
    return trajs, sampler


def mask(*parts):
    """[(n, flag), ...] -> bool array."""
    return np.concatenate([np.full(n, flag, bool) for n, flag in parts])


def test_safe_eval():
    assert safe_eval("48/2") == 24
    assert safe_eval("(3 + 4) * -2") == -14
    assert safe_eval("2**10 % 7 + 7//2") == 2 + 3
    assert safe_eval("1,000 * 0.1") == 100
    assert format_number(safe_eval("1/3")) == "0.3333333333"
    assert format_number(safe_eval("5/2")) == "2.5"
    for bad, msg in [("__import__('os')", "unsupported"), ("2**1000", "exponent"),
                     ("10**20**2", "exponent"), ("1/0", "division by zero"), ("2**0.5", "integer"),
                     ("abs(-1)", "unsupported"), ("", "empty"), ("1+", "syntax"),
                     ("9**60", "magnitude"), ("x", "unsupported")]:
        with pytest.raises(ArithmeticError_, match=msg):
            safe_eval(bad)
    with pytest.raises(ArithmeticError_, match="longer"):
        safe_eval("1+" * 20 + "1", ArithLimits(max_chars=10))


def test_parse_tool_call():
    tools = {"calc", "search"}
    assert parse_tool_call("x <calc> 1+1 </calc> y", tools).argument == "1+1"
    assert parse_tool_call("<result>3</result> done", tools) is None
    assert "unknown tool 'weather'" in parse_tool_call("<weather>Paris</weather>", tools).error
    assert "malformed" in parse_tool_call("<calc>1+1", tools).error


def test_correct_call_then_answer(calc_factory):
    (traj,), sampler = run([["<calc>48/2</calc><result>99</result> junk"], ["So #### 24"]],
                           calc_factory, max_turns=4)
    calc, result, answer = "<calc>48/2</calc>", "<result>24</result>", "So #### 24"
    assert TOK.decode(traj.response_ids) == calc + result + answer
    expected_mask = mask((len(calc), True), (len(result), False), (len(answer) + 1, True))
    np.testing.assert_array_equal(traj.loss_mask, expected_mask)
    np.testing.assert_array_equal(traj.token_version, np.where(expected_mask, 7, -1))
    np.testing.assert_array_equal(traj.logp_mu[~expected_mask], 0.0)
    np.testing.assert_array_equal(traj.entropy_mu[~expected_mask], 0.0)
    np.testing.assert_allclose(traj.logp_mu[: len(calc)], -(np.arange(len(calc)) + 1) / 100)
    assert traj.response_ids[-1] == EOS and traj.reward == 1.0
    assert {k: traj.info[k] for k in ("turns", "tool_calls", "tool_errors", "truncated")} == {
        "turns": 2, "tool_calls": 1, "tool_errors": 0, "truncated": False}
    # Second turn conditions on prompt + everything so far; seeds differ per turn.
    context = list(traj.prompt_ids) + list(traj.response_ids[: -len(answer) - 1])
    assert sampler.calls[1][0][0] == context
    assert sampler.calls[0][1].seed != sampler.calls[1][1].seed
    assert sampler.calls[0][1].stop_token_ids == (EOS,)  # filled from the tokenizer
    assert TOK.decode(traj.prompt_ids).startswith("<|user|>Natalia")


@pytest.mark.parametrize("call, error", [
    ("<calc>48/</calc>", "<error>invalid syntax: '48/'</error>"),
    ("<calc>__import__('os')</calc>", "<error>unsupported syntax: Call</error>"),
    ("<weather>Paris</weather>", "<error>unknown tool 'weather'; available: calc</error>"),
])
def test_bad_calls_get_error_observations(calc_factory, call, error):
    (traj,), _ = run([[call], ["#### 24"]], calc_factory, max_turns=3)
    # An unknown tool has no stop string: its turn keeps the EOS token.
    n_call = len(call) + (call.startswith("<weather>"))
    expected = mask((n_call, True), (len(error), False), (len("#### 24") + 1, True))
    np.testing.assert_array_equal(traj.loss_mask, expected)
    assert TOK.decode(traj.response_ids[n_call : n_call + len(error)]) == error
    assert (traj.reward, traj.info["tool_errors"], traj.info["tool_calls"]) == (1.0, 1, 1)


def test_unclosed_call_is_malformed(calc_factory):
    (traj,), _ = run([["<calc>48/2"], ["#### 24"]], calc_factory, max_turns=3)
    error = "<error>malformed call: '<calc>' without '</calc>'</error>"
    expected = mask((len("<calc>48/2") + 1, True), (len(error), False), (8, True))
    np.testing.assert_array_equal(traj.loss_mask, expected)
    assert traj.info["tool_errors"] == 1 and traj.reward == 1.0


def test_too_many_turns_truncates_with_zero_reward(calc_factory):
    (traj,), sampler = run([["<calc>1+1</calc>"], ["<calc>2+2</calc>"]], calc_factory, max_turns=2)
    parts = [("<calc>1+1</calc>", True), ("<result>2</result>", False),
             ("<calc>2+2</calc>", True), ("<result>4</result>", False)]
    np.testing.assert_array_equal(traj.loss_mask, mask(*[(len(t), f) for t, f in parts]))
    assert (traj.reward, traj.info["truncated"], traj.info["turns"]) == (0.0, True, 2)
    assert len(sampler.calls) == 2


def test_answer_without_call(calc_factory):
    (right, wrong), sampler = run([["The answer is\n#### 24", "#### 25"]], calc_factory,
                                  num_samples=2, max_turns=3)
    np.testing.assert_array_equal(right.loss_mask, np.ones(len("The answer is\n#### 24") + 1, bool))
    assert (right.reward, wrong.reward) == (1.0, 0.0)
    assert right.info["tool_calls"] == 0 and right.info["turns"] == 1
    assert sampler.calls[0][2] == 2 and len(sampler.calls[0][0]) == 1


def test_huge_tool_output_is_truncated():
    def factory():
        tools = {"dump": lambda arg: "x" * 5000}
        return ToolEnv(PromptTemplate(style="plain"), tools, lambda t, ex: (1.0, {}),
                       max_observation_chars=40)

    (traj,), _ = run([["<dump>all</dump>"], ["done"]], factory, max_turns=3,
                     max_observation_tokens=30)
    n_call = len("<dump>all</dump>")
    obs = TOK.decode(traj.response_ids[n_call : n_call + 30])
    assert obs == "<result>" + "x" * 22  # env cut at 40 chars, runner cut at 30 tokens
    np.testing.assert_array_equal(traj.loss_mask, mask((n_call, True), (30, False), (5, True)))
    assert traj.info["observation_truncated"] == 1 and traj.reward == 1.0
    # The token budget also bounds observations: 16 + 10 tokens, then truncated.
    (traj,), sampler = run([["<dump>all</dump>"]], factory, max_turns=3, max_total_tokens=26)
    np.testing.assert_array_equal(traj.loss_mask, mask((n_call, True), (10, False)))
    assert traj.info["truncated"] and traj.reward == 0.0 and len(sampler.calls) == 1
    assert sampler.calls[0][1].max_new_tokens == 26


def test_policy_tokens_cut_to_budget(calc_factory):
    (traj,), _ = run([["#### 24 and a long tail of text"]], calc_factory, max_total_tokens=7)
    np.testing.assert_array_equal(traj.loss_mask, np.ones(7, bool))
    assert traj.finish_reason == "length" and traj.reward == 1.0  # "#### 24" fits exactly


def test_groups_and_single_turn_env():
    scorer = MathScorer(MathVerifier())
    examples = [dict(EXAMPLE), {"id": "ex1", "question": "1+2?", "answer": "3"}]
    (a, b, c, d), sampler = run(
        [["\\boxed{24}", "no", "#### 3", "#### 3.0"]],
        lambda: SingleTurnEnv(PromptTemplate(style="plain"), scorer), examples, num_samples=2)
    assert [t.group_id for t in (a, b, c, d)] == [0, 0, 1, 1]
    assert [t.reward for t in (a, b, c, d)] == [1.0, 0.0, 1.0, 1.0]
    assert all(t.loss_mask.all() for t in (a, b, c, d))
    assert [t.info["example_id"] for t in (a, c)] == ["ex0", "ex1"]
    assert TOK.decode(sampler.calls[0][0][1]).startswith("Question: 1+2?")


def test_trajectories_record_the_sampling_parameters_they_were_drawn_with(calc_factory):
    """Every turn shares the call's temperature and filters; the trajectory records them
    (the learner refuses to score them under others: learners.contract.check_behavior)."""
    params = SamplingParams(max_new_tokens=64, seed=3, temperature=0.7, top_k=5, min_p=0.1)
    trajs = run_episodes(ScriptedSampler([["<calc>48/2</calc>"] * 2, ["#### 24"] * 2]), TOK,
                         calc_factory, [EXAMPLE], params, 2, RolloutConfig(max_turns=2))
    assert [t.behavior for t in trajs] == [BehaviorParams(0.7, 5, 1.0, 0.1)] * 2
    assert [t.info["turns"] for t in trajs] == [2, 2]


def test_stop_cut_binary_search():
    ids = TOK.encode("ab</calc>cd")
    assert stop_cut(ids, ("</calc>",), TOK.decode) == 9
    assert stop_cut(ids, ("zz",), TOK.decode) is None
    assert stop_cut(ids, (), TOK.decode) is None


def test_search_corpus_and_env():
    docs, examples = make_corpus(seed=5)
    docs2, examples2 = make_corpus(seed=5)
    assert docs == docs2 and examples == examples2
    assert make_corpus(seed=6)[1] != examples
    index = BM25Index(docs)
    ex = examples[0]
    company = ex["question"].split("founder of ")[1].removesuffix(" born?")
    company_doc = next(d for d in docs if d.title == company)
    assert index.search_ids(company, 3)[0] == company_doc.doc_id
    founder = company_doc.text.split("founded by ")[1].split(" in ")[0]
    person_doc = next(d for d in docs if d.title == founder)
    assert f"born in {ex['answer']} in" in person_doc.text
    script = [[f"<search>{company}</search>"], [f"<open>{person_doc.doc_id}</open>"],
              ["<open>doc-999</open>"], [f"It is \\boxed{{{ex['answer']}}}"]]
    (traj,), _ = run(script, lambda: make_search_env(index), [ex], max_turns=5,
                     max_total_tokens=4096, max_observation_tokens=1000)
    assert (traj.reward, traj.info["tool_calls"], traj.info["tool_errors"]) == (1.0, 3, 1)
    text = TOK.decode(traj.response_ids)
    assert f"[{company_doc.doc_id}] {company}:" in text and person_doc.text in text
    assert "<error>unknown doc_id 'doc-999'</error>" in text
    assert normalize_name("Zan-Tor \\text{Labs}.") == "zantorlabs"


class VisibleEosTokenizer(ByteTokenizer):
    """Like ByteTokenizer, but decode renders EOS as text (as real tokenizers do)."""

    def decode(self, ids):
        return "".join("<eos>" if i == EOS else chr(i) for i in ids)


def test_final_eos_is_not_part_of_the_text_the_environment_scores():
    verifier = MathVerifier()
    env = lambda: SingleTurnEnv(PromptTemplate(style="plain", instruction=""), MathScorer(verifier))
    trajs = run_episodes(ScriptedSampler([["#### 24"]]), VisibleEosTokenizer(), env,
                         [EXAMPLE], PARAMS, 1)
    assert trajs[0].reward == 1.0 and trajs[0].info["pred"] == "24"
    assert trajs[0].response_ids[-1] == EOS and trajs[0].loss_mask[-1]  # still trained on
    verifier.close()
