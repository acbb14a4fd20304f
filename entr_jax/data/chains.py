"""Chain arithmetic with worked steps: long responses for the stress regime.

A problem is a chain of additions and subtractions (reasoning-gym's ``chain_sum`` task,
e.g. ``"4+1-7-7"``); the worked solution does one operation per line and ends with the
final answer, in one of two styles::

    question  "4+1-7-7"
    reduce    "5-7-7\\n-2-7\\n-9\\n#### -9"          (the new total, then the rest of the chain)
    running   "4+1=5\\n5-7=-2\\n-2-7=-9\\n#### -9"   (the running total, the term, the new total)

In ``reduce`` (a scratchpad reduction) every line applies the first operation and copies
the remaining chain from the line above; in ``running`` the next term must be found in
the prompt. Either way most tokens are copies (near-deterministic once the format is
learned) and the new totals are the uncertain ones, so a response mixes low- and
high-entropy positions; the final answer is right only if every step is, so the reward
depends on the whole response. With the tiny tokenizer (one token per digit, operator and
newline; ``####`` and ``" -"`` are one token each) ``reduce`` over 9 one-digit terms gives
76-92 response tokens (EOS included; the stress preset), ``running`` over 8 two-digit
terms 62-93. (The tiny model does not learn ``running`` over two-digit terms in 400
supervised steps: held-out accuracy 0, operands copied wrongly from the prompt.)

Train and held-out problems come from disjoint reasoning-gym seeds; held-out expressions
that also occur in the training set are dropped.
"""

from __future__ import annotations

from typing import Sequence

from entr_jax.data.procedural import Example, reasoning_gym_source
from entr_jax.data.templates import PromptTemplate

# reasoning-gym seeds item i of a dataset with Random(seed + i): the held-out seed is far
# above any training size, so the two splits never share a generator seed.
EVAL_SEED_OFFSET = 10**7


STYLES = ("reduce", "running")


def worked_chain(expression: str, style: str = "reduce") -> tuple[str, int]:
    """The worked solution of a chain of ``+``/``-`` over non-negative integers.

    Args:
      expression: ``"a op b op c ..."`` with single spaces (reasoning-gym's format) or
        none (``"a+b-c"``); integers and ``+``/``-`` only.
      style: ``"reduce"``: line ``k`` is the total after ``k`` operations followed by the
        remaining operations (``"5-7-7"``, ..., the last line the bare total);
        ``"running"``: line ``k`` is ``"<total><op><term>=<new total>"``.
    Returns:
      ``(solution, total)``: the lines, then ``"#### <total>"``; ``total`` is exact.
    Raises:
      ValueError: a malformed expression (the message quotes it) or an unknown style.
    """
    if style not in STYLES:
        raise ValueError(f"worked_chain: style must be one of {STYLES}, got {style!r}")
    terms, ops, number = [], [], ""
    for ch in expression.replace(" ", ""):
        if ch.isdigit():
            number += ch
        elif ch in "+-" and number:
            terms.append(int(number))
            ops.append(ch)
            number = ""
        else:
            raise ValueError(f"worked_chain: not a chain of '+'/'-' over integers: {expression!r}")
    if not number or not ops:
        raise ValueError(f"worked_chain: need at least two terms: {expression!r}")
    terms.append(int(number))
    steps = list(zip(ops, terms[1:]))
    total, lines = terms[0], []
    for k, (op, term) in enumerate(steps):
        new = total + term if op == "+" else total - term
        if style == "running":
            lines.append(f"{total}{op}{term}={new}")
        else:
            lines.append(f"{new}" + "".join(f"{o}{t}" for o, t in steps[k + 1:]))
        total = new
    return "\n".join(lines) + f"\n#### {total}", total


def chain_sum_source(
    split: str = "train",
    size: int = 20000,
    min_terms: int = 9,
    max_terms: int = 9,
    min_digits: int = 2,
    max_digits: int = 2,
    seed: int = 0,
    train_size: int = 20000,
    min_solution_chars: int = 0,
    style: str = "reduce",
) -> list[Example]:
    """Chain problems with worked solutions (reasoning-gym ``chain_sum``, seeded).

    Args:
      split: ``"train"`` (reasoning-gym seed ``seed``) or ``"eval"`` (seed
        ``seed + EVAL_SEED_OFFSET``; expressions that occur in the training split of
        ``train_size`` problems at the same settings are dropped).
      size: problems generated for the split (``eval`` may keep fewer after the drop).
      train_size: ``eval`` only: size of the training split to exclude.
      min_solution_chars: drop problems whose worked solution has fewer characters (a
        length floor for the responses; with the tiny tokenizer a solution of ``c``
        characters is ``c - 3`` tokens, ``####`` being one, ``c - 4`` when the answer is
        negative, ``" -"`` being one; plus the EOS).
      style: of the worked solution (`worked_chain`).
      min_terms, max_terms: terms per chain (each problem draws one count).
      min_digits, max_digits: digits per term (each problem draws one count; 1 digit
        means 0-9).
    Returns:
      examples ``{"id", "question" (no spaces, e.g. "48+24-9"), "answer", "solution"
      (`worked_chain` in ``style``), "source": "chain_sum"}``.
    Raises:
      ValueError: bad split or sizes; the reasoning-gym answer disagrees with the worked
        total (never expected).
    """
    if split not in ("train", "eval"):
        raise ValueError(f"chain_sum_source: split must be 'train' or 'eval', got {split!r}")
    kw = dict(min_terms=min_terms, max_terms=max_terms, min_digits=min_digits,
              max_digits=max_digits)
    rows = reasoning_gym_source("chain_sum", size=size,
                                seed=seed if split == "train" else seed + EVAL_SEED_OFFSET, **kw)
    train_exprs: set[str] = set()
    if split == "eval":
        train_exprs = {r["metadata"]["expression"]
                       for r in reasoning_gym_source("chain_sum", size=train_size, seed=seed, **kw)}
    out = []
    for i, row in enumerate(rows):
        expression = row["metadata"]["expression"]
        if expression in train_exprs:
            continue
        solution, total = worked_chain(expression, style)
        if len(solution) < min_solution_chars:
            continue
        if str(total) != row["answer"]:
            raise ValueError(f"chain_sum_source: worked total {total} != reasoning-gym "
                             f"answer {row['answer']} for {expression!r}")
        out.append({"id": f"chain_sum/{split}/{seed}/{i}",
                    "question": expression.replace(" ", ""), "answer": row["answer"],
                    "solution": solution, "source": "chain_sum"})
    return out


def solution_demos(examples: Sequence[Example], template: PromptTemplate) -> list[dict]:
    """SFT demos whose completion is the example's worked ``solution`` (all trainable).

    Returns ``{"id", "prompt", "completion", "segments"}`` as `entr_jax.data.sft` does.
    Raises ValueError naming an example without a ``solution``.
    """
    demos = []
    for ex in examples:
        if not ex.get("solution"):
            raise ValueError(f"solution_demos: example {ex.get('id')!r} has no 'solution'")
        demos.append({"id": ex["id"], "prompt": template.render(ex["question"]),
                      "completion": ex["solution"], "segments": [(ex["solution"], True)]})
    return demos
