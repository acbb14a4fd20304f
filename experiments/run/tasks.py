"""Task wiring: a `TaskSpec` becomes training prompts, evaluation sets, an environment
factory and SFT demonstrations, all from `entr_jax.data` and `entr_jax.tasks`."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import numpy as np

from entr_jax.data import PromptTemplate, encode_prompt, load_source
from entr_jax.data.chains import solution_demos
from entr_jax.data.sft import answer_demos, gsm8k_calc_demos
from entr_jax.data.templates import GSM8K_INSTRUCTION, MATH_INSTRUCTION
from entr_jax.tasks.calculator import CALC_INSTRUCTION, make_calculator_env
from entr_jax.tasks.env import Environment, SingleTurnEnv
from entr_jax.tasks.exact import ExactNumberScorer
from entr_jax.tasks.rewards import MathScorer, MathVerifier, VerifierConfig
from entr_jax.tasks.rollout import RolloutConfig
from entr_jax.tasks.search import BM25Index, make_corpus, make_search_env
from entr_jax.types import Trajectory
from experiments.run.config import TaskSpec

# The arithmetic task keeps prompts tiny: "48/2=" -> "#### 24".
ARITHMETIC_PLAIN_FORMAT = "{question}{instruction}="


@dataclasses.dataclass
class TaskBundle:
    """Everything the loop needs from a task.

    Attributes:
      train: training examples (``id``, ``question``, ``answer``, ...).
      eval_sets: benchmark name -> held-out examples.
      env_factory: a fresh `Environment` per episode.
      rollout: episode bounds.
      demos: SFT demonstrations (``prompt``, ``segments``), or an empty list.
      verifier: the shared `MathVerifier` (close it at the end).
      reference_demos: held-out examples -> their reference solutions as demonstrations
        (the same form as ``demos``), for the teacher-forced log-likelihood of evaluation;
        None when the task's evaluation examples have no reference solution.
    """

    train: list[dict]
    eval_sets: dict[str, list[dict]]
    env_factory: Callable[[], Environment]
    rollout: RolloutConfig
    demos: list[dict]
    verifier: MathVerifier
    reference_demos: Callable[[list[dict]], list[dict]] | None = None


def _template(spec: TaskSpec, instruction: str, plain_format: str | None = None) -> PromptTemplate:
    if spec.template == "plain":
        return PromptTemplate(style="plain", instruction=instruction,
                              **({"plain_format": plain_format} if plain_format else {}))
    return PromptTemplate(style="chat", instruction=instruction)


def _first(examples: list[dict], n: int) -> list[dict]:
    return examples if n == 0 else examples[:n]


def build_task(spec: TaskSpec, verifier_config: VerifierConfig = VerifierConfig(),
               data_dir: str = "") -> TaskBundle:
    """The `TaskBundle` of a task spec (see `TaskSpec.name` for the tasks); answers are
    checked by a `MathVerifier` with ``verifier_config`` (worker count, time limit); data
    files are looked up in ``data_dir`` (``--data.dir``; empty: ``$ENTR_DATA_DIR``) first,
    then as `entr_jax.data.files.locate` describes."""
    load = functools.partial(load_source, data_dir=data_dir)
    verifier = MathVerifier(verifier_config)
    rollout = RolloutConfig(max_turns=spec.max_turns, max_total_tokens=spec.max_total_tokens)
    n_eval = spec.eval_examples
    if spec.name == "arithmetic":
        template = _template(spec, "", ARITHMETIC_PLAIN_FORMAT)
        # every gold answer is the integer value of its expression (entr_jax.data.sources):
        # exact comparison, no math-verify worker (an expression such as "48/2" as the
        # answer is wrong here); the last number counts when there is no "####"
        scorer = ExactNumberScorer(fallback_last_number=True)
        def arithmetic(split):
            rows = load("gsm8k_arithmetic", split=split, max_chars=spec.arithmetic_max_chars)
            ops = set("+-*/")
            return [r for r in rows if ops & set(r["question"][1:]) <= set(spec.arithmetic_ops)]

        train, evals = arithmetic("train"), arithmetic("eval")
        return TaskBundle(
            train=train,
            eval_sets={"arithmetic": _first(evals, n_eval)},
            env_factory=lambda: SingleTurnEnv(template, scorer),
            rollout=rollout,
            demos=answer_demos(train, template),
            verifier=verifier,
            reference_demos=lambda examples: answer_demos(examples, template),
        )
    if spec.name == "chain_sum":
        # "4+1-7-7=" -> "5-7-7\n-2-7\n-9\n#### -9" (reduce style); only a plain number
        # after '####' counts, compared exactly (no math-verify worker)
        template = _template(spec, "", ARITHMETIC_PLAIN_FORMAT)
        scorer = ExactNumberScorer()
        kw = dict(min_terms=spec.chain_terms_min, max_terms=spec.chain_terms_max,
                  min_digits=spec.chain_digits_min, max_digits=spec.chain_digits_max,
                  min_solution_chars=spec.chain_min_solution_chars, style=spec.chain_style)
        train = load_source("chain_sum", split="train", size=spec.chain_train_size, **kw)
        evals = load_source("chain_sum", split="eval", size=n_eval or 1000,
                            train_size=spec.chain_train_size, **kw)
        return TaskBundle(
            train=train,
            eval_sets={"chain_sum": evals},
            env_factory=lambda: SingleTurnEnv(template, scorer),
            rollout=rollout,
            demos=solution_demos(train, template),
            verifier=verifier,
            reference_demos=lambda examples: solution_demos(examples, template),
        )
    if spec.name in ("gsm8k", "math"):
        instruction = GSM8K_INSTRUCTION if spec.name == "gsm8k" else MATH_INSTRUCTION
        template = _template(spec, instruction)
        scorer = MathScorer(verifier)
        train = load("gsm8k", split="train")
        if spec.name == "gsm8k":
            evals = {"gsm8k": _first(load("gsm8k", split="test"), n_eval)}
        else:
            evals = {name: _first(load(name), n_eval)
                     for name in ("math500", "aime24", "amc23")}
        # no demonstrations: these tasks start from a pretrained (instruct) checkpoint
        return TaskBundle(train, evals, lambda: SingleTurnEnv(template, scorer), rollout,
                          [], verifier)
    if spec.name == "gsm8k_calculator":
        template = _template(spec, CALC_INSTRUCTION)
        scorer = MathScorer(verifier)
        train = load("gsm8k", split="train")
        return TaskBundle(
            train=train,
            eval_sets={"gsm8k": _first(load("gsm8k", split="test"), n_eval)},
            env_factory=lambda: make_calculator_env(scorer, template),
            rollout=rollout,
            demos=gsm8k_calc_demos(train, template),
            verifier=verifier,
            reference_demos=lambda examples: gsm8k_calc_demos(examples, template),
        )
    if spec.name == "search":
        docs, examples = make_corpus(seed=0)
        index = BM25Index(docs)
        held_out = [e for i, e in enumerate(examples) if i % 4 == 3]
        train = [e for i, e in enumerate(examples) if i % 4 != 3]
        return TaskBundle(train, {"search": _first(held_out, n_eval)},
                          lambda: make_search_env(index), rollout, [], verifier)
    raise ValueError(f"task.name {spec.name!r} is unknown")


def demo_trajectory(demo: dict, tokenizer: Any) -> Trajectory:
    """An SFT demonstration as a `Trajectory`: trainable segments (and the final EOS)
    carry ``loss_mask``; environment segments (tool results) do not."""
    prompt_ids = encode_prompt(tokenizer, demo["prompt"])
    ids: list[int] = []
    mask: list[bool] = []
    for text, trainable in demo["segments"]:
        seg = tokenizer.encode(text)
        ids += seg
        mask += [trainable] * len(seg)
    ids.append(tokenizer.eos_token_ids[0])
    mask.append(True)
    n = len(ids)
    return Trajectory(
        prompt_ids=np.asarray(prompt_ids, np.int32),
        response_ids=np.asarray(ids, np.int32),
        logp_mu=np.zeros(n, np.float32),
        entropy_mu=np.zeros(n, np.float32),
        token_version=np.zeros(n, np.int32),
        loss_mask=np.asarray(mask, bool),
    )
