"""Sources, the grain prompt-batch iterator (determinism, resume), templates and SFT demos."""

import json

import pytest

from entr_jax.data import sources
from entr_jax.data.pipeline import PromptBatchIterator, PromptDataConfig
from entr_jax.data.sft import answer_demos, gsm8k_calc_demos, rewrite_calc_annotations
from entr_jax.data.templates import PromptTemplate, encode_prompt
from entr_jax.tasks.arith import safe_eval

EXAMPLES = [{"id": f"e{i}", "question": f"q{i}", "answer": str(i)} for i in range(23)]


def ids(batches):
    return [[ex["id"] for ex in batch] for batch in batches]


def take(it, n):
    return [next(it) for _ in range(n)]


@pytest.mark.parametrize("name, kwargs, n", [
    ("gsm8k", {"split": "train"}, 7473), ("gsm8k", {"split": "test"}, 1319),
    ("math500", {}, 500), ("aime24", {}, 30), ("amc23", {}, 40),
])
def test_benchmark_sources(name, kwargs, n):
    rows = sources.load_source(name, **kwargs)
    assert len(rows) == n and len({r["id"] for r in rows}) == n
    assert all(isinstance(r["question"], str) and isinstance(r["answer"], str) for r in rows)


def test_source_answers():
    assert sources.load_gsm8k("test")[0]["answer"] == "18"
    assert sources.load_aime24()[7]["answer"] == "025"
    assert sources.load_amc23()[0]["answer"] == "27"
    assert sources.gsm8k_final_answer("... #### 1,000") == "1000"
    with pytest.raises(ValueError, match="split"):
        sources.load_gsm8k("dev")
    with pytest.raises(ValueError, match="unknown data source"):
        sources.load_source("nope")


def test_data_dir_override(monkeypatch, tmp_path, unpackaged):
    unpackaged("math500/test.jsonl")  # else the package's copy is next in line
    monkeypatch.setenv("ENTR_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("ENTR_DATA_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("ENTR_DATA_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match=r"data folder \(ENTR_DATA_DIR\): .*math500/test.jsonl does not exist"):
        sources.load_math500()


def test_gsm8k_arithmetic_split_and_filter():
    train, held_out = sources.gsm8k_arithmetic("train"), sources.gsm8k_arithmetic("eval")
    train_q, eval_q = {e["question"] for e in train}, {e["question"] for e in held_out}
    assert not train_q & eval_q and len(train_q) == len(train) and len(eval_q) == len(held_out)
    assert 0.05 < len(held_out) / (len(train) + len(held_out)) < 0.15
    assert {"question": "48/2", "answer": "24"}.items() <= next(
        e for e in train + held_out if e["question"] == "48/2").items()
    for e in train + held_out:
        assert len(e["question"]) <= 30 and " " not in e["question"]
        assert set(e["question"]) <= set("0123456789+-*/().")
        value = safe_eval(e["question"])
        assert value.denominator == 1 and str(value.numerator) == e["answer"]


def test_reasoning_gym_source_is_seeded():
    a = sources.reasoning_gym_source("basic_arithmetic", size=5, seed=1)
    assert a == sources.reasoning_gym_source("basic_arithmetic", size=5, seed=1)
    assert a != sources.reasoning_gym_source("basic_arithmetic", size=5, seed=2)
    assert a[0]["id"] == "rg/basic_arithmetic/1/0" and a[0]["answer"]


def test_reasoning_gym_missing_names_the_study_extra(monkeypatch):
    """A plain install has no reasoning-gym: the study's stress task must say which extra
    brings it, and that extra must hold it."""
    import pathlib
    import sys
    import tomllib

    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # import fails as if not installed
    with pytest.raises(ImportError, match=r"^data source reasoning_gym/chain_sum needs the "
                       r"reasoning-gym package, which a plain install leaves out: pip install "
                       r"'entr-jax\[study\]'"):
        sources.reasoning_gym_source("chain_sum", size=1)
    from experiments.run.errors import is_complete, is_user_error

    try:
        sources.reasoning_gym_source("chain_sum", size=1)
    except ImportError as e:  # entr-run prints it as one line, exit 2, not "a bug?"
        assert is_user_error(e) and is_complete(e)
    pyproject = pathlib.Path(__file__).resolve().parents[1] / "pyproject.toml"
    extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    assert {d.split(">")[0] for d in extras["study"]} == {"reasoning-gym", "matplotlib"}


def test_same_seed_same_order_and_epochs():
    cfg = PromptDataConfig(batch_size=5, seed=11, num_epochs=2)
    first = ids(PromptBatchIterator(EXAMPLES, cfg))
    assert first == ids(PromptBatchIterator(EXAMPLES, cfg))
    assert len(first) == 2 * 4  # 23 // 5 batches per epoch, 2 epochs, then StopIteration
    for epoch in (first[:4], first[4:]):
        flat = [i for b in epoch for i in b]
        assert len(set(flat)) == 20  # a permutation minus the remainder, no repeats
    assert first[:4] != first[4:]  # reshuffled each epoch
    other_cfg = PromptDataConfig(batch_size=5, seed=12, num_epochs=2)
    other = ids(PromptBatchIterator(EXAMPLES, other_cfg))
    assert other != first
    plain_cfg = PromptDataConfig(batch_size=5, shuffle=False)
    plain = ids(take(PromptBatchIterator(EXAMPLES, plain_cfg), 1))
    assert plain == [["e0", "e1", "e2", "e3", "e4"]]


def test_resume_mid_epoch_exactly():
    cfg = PromptDataConfig(batch_size=4, seed=3)
    it = PromptBatchIterator(EXAMPLES, cfg)
    take(it, 7)  # 5 batches per epoch: now inside epoch 1
    state = json.loads(json.dumps(it.get_state()))
    expected = take(it, 9)
    resumed = PromptBatchIterator(EXAMPLES, cfg)
    resumed.set_state(state)
    assert resumed.epoch == 1
    got = take(resumed, 9)
    assert got == expected and [b[0]["epoch"] for b in got] == [1, 1, 1, 2, 2, 2, 2, 2, 3]
    with pytest.raises(ValueError, match="another configuration"):
        PromptBatchIterator(EXAMPLES, PromptDataConfig(batch_size=4, seed=4)).set_state(state)
    with pytest.raises(ValueError, match="another configuration"):
        PromptBatchIterator(EXAMPLES[1:], cfg).set_state(state)


def test_iterator_validation():
    with pytest.raises(ValueError, match="batch_size"):
        PromptDataConfig(batch_size=0)
    with pytest.raises(ValueError, match="examples < batch_size"):
        PromptBatchIterator(EXAMPLES[:2], PromptDataConfig(batch_size=3))
    with pytest.raises(ValueError, match="unique"):
        PromptBatchIterator(EXAMPLES + EXAMPLES[:1], PromptDataConfig(batch_size=3))


class _Tok:
    def encode(self, text):
        return [ord(c) for c in text]

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True):
        return self.encode("|".join(f"{m['role']}:{m['content']}" for m in messages) + "|A:")


def test_templates():
    chat = PromptTemplate(instruction="Box it.", system="Be brief.")
    assert chat.render("1+1?") == [{"role": "system", "content": "Be brief."},
                                   {"role": "user", "content": "1+1?\n\nBox it."}]
    assert encode_prompt(_Tok(), chat.render("q")) == _Tok().encode(
        "system:Be brief.|user:q\n\nBox it.|A:")
    plain = PromptTemplate(style="plain", instruction="Box it.")
    assert plain.render("1+1?") == "Question: 1+1?\nBox it.\nAnswer:"
    assert encode_prompt(_Tok(), "ab") == [97, 98]
    with pytest.raises(ValueError, match="style"):
        PromptTemplate(style="fancy")
    with pytest.raises(TypeError, match="prompt"):
        encode_prompt(_Tok(), 5)


def test_sft_rewrites_calculator_annotations():
    segs = rewrite_calc_annotations(
        "Eggs: 16 - 3 = <<16-3=13>>13 left. Half: <<13/2=6.5>>6.5.\n#### 6.5"
    )
    assert segs == [("Eggs: 16 - 3 = ", True), ("<calc>16-3</calc>", True),
                    ("<result>13</result>", False), (" left. Half: ", True),
                    ("<calc>13/2</calc>", True), ("<result>6.5</result>", False),
                    (".\n#### 6.5", True)]
    demos = gsm8k_calc_demos(sources.load_gsm8k("train")[:50], PromptTemplate())
    assert demos[0]["completion"] == (
        "Natalia sold 48/2 = <calc>48/2</calc><result>24</result> clips in May.\n"
        "Natalia sold 48+24 = <calc>48+24</calc><result>72</result> clips altogether in April "
        "and May.\n#### 72")
    for d in demos:
        assert "<<" not in d["completion"]
        assert "".join(t for t, _ in d["segments"]) == d["completion"]
        assert all(not f for t, f in d["segments"] if t.startswith("<result>"))
    (arith,) = answer_demos([{"id": "a", "question": "48/2", "answer": "24"}],
                            PromptTemplate(style="plain"), use_calculator=True)
    assert arith["completion"] == "<calc>48/2</calc><result>24</result>\n#### 24"
    assert arith["segments"][1] == ("<result>24</result>", False)
