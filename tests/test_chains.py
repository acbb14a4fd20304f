"""The stress testbed's task (entr_jax.data.chains, the chain_sum task, the stress preset):
worked solutions, token lengths with the tiny tokenizer, exact scoring, and switch steps
that always fall inside a response."""

import dataclasses

import numpy as np
import pytest

from entr_jax import staleness as st
from entr_jax.assets import tiny_dir
from entr_jax.data.chains import chain_sum_source, worked_chain
from entr_jax.tasks.exact import ExactNumberScorer
from entr_jax.tokenizer import Tokenizer
from experiments.run.configs import preset
from experiments.run.tasks import build_task, demo_trajectory


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer.from_pretrained(str(tiny_dir()))


@pytest.fixture(scope="module")
def stress_task():
    spec = dataclasses.replace(preset("stress").task, chain_train_size=3000)
    return spec, build_task(spec)


def test_worked_chain_styles():
    assert worked_chain("48 + 24 - 9") == ("72-9\n63\n#### 63", 63)
    assert worked_chain("4+1-7-7") == ("5-7-7\n-2-7\n-9\n#### -9", -9)
    assert worked_chain("48 + 24 - 9", "running") == ("48+24=72\n72-9=63\n#### 63", 63)
    assert worked_chain("4-1-7", "running") == ("4-1=3\n3-7=-4\n#### -4", -4)
    for bad in ("48", "48+", "4*2", "-3+4", "4+-3", ""):
        with pytest.raises(ValueError, match="worked_chain"):
            worked_chain(bad)
    with pytest.raises(ValueError, match="style must be one of"):
        worked_chain("1+2", "tree")


def test_chain_source_is_seeded_and_splits_are_disjoint():
    kw = dict(size=200, min_terms=3, max_terms=5, min_digits=1, max_digits=2)
    a = chain_sum_source("train", **kw)
    assert a == chain_sum_source("train", **kw) and a != chain_sum_source("train", seed=1, **kw)
    held_out = chain_sum_source("eval", train_size=200, **kw)
    assert {e["question"] for e in a}.isdisjoint(e["question"] for e in held_out)
    for e in a[:50]:
        terms = e["question"].replace("-", "+").split("+")
        assert 3 <= len(terms) <= 5 and all(1 <= len(t) <= 2 for t in terms)
        assert worked_chain(e["question"]) == (e["solution"], int(e["answer"]))
    running = chain_sum_source("train", style="running", **kw)
    assert [e["question"] for e in running] == [e["question"] for e in a]
    assert running[0]["solution"] == worked_chain(a[0]["question"], "running")[0]
    assert all(len(e["solution"]) >= 40 for e in chain_sum_source("train", min_solution_chars=40, **kw))
    with pytest.raises(ValueError, match="split must be"):
        chain_sum_source("test")


def test_stress_task_token_lengths(stress_task, tokenizer):
    """Every training (first 3000) and held-out response of the stress preset is 76-92
    tokens (EOS included), its prompt 18, the whole episode within max_total_tokens."""
    spec, task = stress_task
    assert len(task.train) == 3000 and len(task.eval_sets["chain_sum"]) == 128
    assert len(task.demos) == len(task.train)
    lengths = {}
    for name, demos in (("train", task.demos),
                        ("eval", [{"prompt": e["question"] + "=", "segments": [(e["solution"], True)]}
                                  for e in task.eval_sets["chain_sum"]])):
        trajs = [demo_trajectory(d, tokenizer) for d in demos]
        r = np.array([len(t.response_ids) for t in trajs])
        p = np.array([len(t.prompt_ids) for t in trajs])
        lengths[name] = (int(r.min()), int(r.max()), int(p.min()), int(p.max()))
        assert int((r + p).max()) <= spec.max_total_tokens == 128
        assert int(r.max()) <= spec.max_new_tokens == 100
    assert lengths == {"train": (76, 92, 18, 18), "eval": (76, 92, 18, 18)}
    assert task.demos[0]["completion"] == task.train[0]["solution"]
    assert task.demos[0]["prompt"] == task.train[0]["question"] + "="


def test_configured_switches_all_fall_inside_every_response(stress_task):
    """Switch steps are drawn from [1, switch_window - 1] = [1, 47], below the shortest
    response (76 tokens), so at 5, 7 and 9 switches every one happens in every response
    of the task and the measured intra staleness equals the configured one (once the ring
    holds enough versions); the loop test below measures it."""
    cfg = preset("stress").staleness
    assert cfg.switch_window - 1 == 47 and cfg.ring_size == 10
    for d in (5, 7, 9):
        c = dataclasses.replace(cfg, inter_lag=1, intra_switches=d)
        plans = [st.intra_plan(c, n) for n in range(d + 1, d + 200)]
        assert all(len(steps) == d and max(steps) <= 47 for _, steps in plans)


def test_exact_number_scorer():
    score = ExactNumberScorer()
    ex = {"id": "x", "answer": "-80"}
    assert score("1+2=3\n#### -80", ex) == (1.0, {"pred": "-80", "method": "hash", "correct": True})
    assert score("#### -80.0", ex)[0] == 1.0 and score("#### -080", ex)[0] == 1.0
    assert score("#### 80", ex)[0] == 0.0
    assert score("3-83=-80", ex) == (0.0, {"pred": None, "method": "none", "correct": False})
    assert score("#### -8*10", ex)[0] == 0.0  # not a plain number: wrong, no math-verify
    with pytest.raises(ValueError, match="not a plain number"):
        score("#### 1", {"id": "y", "answer": "1/2x"})


@pytest.mark.slow
@pytest.mark.parametrize("switches", [5, 7, 9])
def test_measured_intra_staleness_on_the_stress_task(switches, tmp_path):
    """The real loop on the stress task (a small random model, whose responses run to the
    100-token budget unless it samples the EOS): once the ring holds switches + 1 versions,
    the measured intra-trajectory staleness is within 10% of the configured value (exactly
    equal for every response of at least 48 tokens)."""
    import json
    import shutil

    from flax import nnx

    from entr_jax.model import Decoder, ModelConfig, save_pretrained
    from experiments.run.job import Job

    model_dir = tmp_path / "model"
    hf = json.loads((tiny_dir() / "config.json").read_text())
    hf.update(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    save_pretrained(Decoder(ModelConfig.from_hf_config(hf), rngs=nnx.Rngs(0)), model_dir)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(tiny_dir() / name, model_dir / name)
    base = preset("stress")
    cfg = dataclasses.replace(
        base, run_dir=str(tmp_path / "run"), rl_steps=switches + 4, token_samples_every=1,
        model=dataclasses.replace(base.model, path=str(model_dir)),
        task=dataclasses.replace(base.task, prompts_per_step=2, samples_per_prompt=4,
                                 eval_examples=2, eval_samples=1, chain_train_size=200),
        sft=dataclasses.replace(base.sft, steps=0),
        staleness=dataclasses.replace(base.staleness, inter_lag=1, intra_switches=switches))
    Job(cfg, show_progress=False).run_job()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    full = [r for r in rows if r["step"] >= switches + 1]
    assert len(full) == 3
    measured = np.mean([r["staleness/intra_mean"] for r in full])
    assert abs(measured - switches) <= 0.1 * switches
    for r in full:
        z = np.load(tmp_path / "run" / "token_samples" / f"step_{r['step']}.npz")
        for tv, mask in zip(z["token_version"], z["loss_mask"]):
            v = tv[mask]
            if len(v) >= 48:
                assert v.max() - v.min() == switches


def test_exact_number_scorer_with_the_last_number_fallback():
    """The arithmetic task's scorer: the last number counts when there is no "####"; only
    a plain number equal to the gold integer is correct (an expression is not)."""
    score = ExactNumberScorer(fallback_last_number=True)
    ex = {"id": "gsm8k_arith/48/2", "answer": "24"}
    assert score("#### 24", ex) == (1.0, {"pred": "24", "method": "hash", "correct": True})
    assert score("it is 24", ex) == (1.0, {"pred": "24", "method": "last_number",
                                           "correct": True})
    assert score("#### 24.0", ex)[0] == 1.0 and score("#### 1,024", ex)[0] == 0.0
    assert score("#### 48/2", ex) == (0.0, {"pred": "48/2", "method": "hash",
                                            "correct": False})
    assert score("24 then #### 25", ex)[0] == 0.0  # the marker wins over the last number
    assert score("no number", ex) == (0.0, {"pred": None, "method": "none", "correct": False})
    assert ExactNumberScorer()("it is 24", ex)[0] == 0.0  # no fallback by default


def test_arithmetic_task_scores_exactly_without_math_verify():
    from experiments.run.configs import QUICKSTART
    from experiments.run.tasks import build_task

    task = build_task(QUICKSTART.task)
    scorer = task.env_factory().scorer
    assert isinstance(scorer, ExactNumberScorer) and scorer.fallback_last_number
    examples = task.train + task.eval_sets["arithmetic"]
    assert len(examples) == 1404 + 153
    # every gold answer is a plain integer: its own value scores 1, its successor 0
    assert all(scorer(f"#### {e['answer']}", e)[0] == 1.0 for e in examples)
    assert not any(scorer(f"#### {int(e['answer']) + 1}", e)[0] for e in examples)
    assert task.verifier.num_checks == 0
