"""SFT demonstrations (data side): (prompt, completion) text pairs so RL starts with reward.

* `gsm8k_calc_demos`: GSM8K worked solutions with each calculator annotation
  ``<<48/2=24>>24`` rewritten into the calculator tool syntax of
  `entr_jax.tasks.calculator` as ``<calc>48/2</calc><result>24</result>`` (the result
  printed exactly as the calculator tool prints it; the duplicated number that follows the
  annotation in the text is dropped). Annotations our calculator rejects keep only their
  visible text.
* `answer_demos`: any source with a short answer (``gsm8k_arithmetic``, reasoning-gym):
  the completion is ``#### <answer>``, or ``<calc>q</calc><result>a</result>\\n#### a``
  with ``use_calculator`` for arithmetic expressions.

Each demo: ``{"id", "prompt" (chat messages or text, from the template), "completion",
"segments"}``. ``segments`` lists ``(text, trainable)`` pieces whose concatenation is the
completion; ``<result>...</result>`` pieces are environment output (``trainable=False``),
mirroring the rollout loss mask.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from entr_jax.data.sources import CALC_ANNOTATION_RE
from entr_jax.data.templates import PromptTemplate
from entr_jax.tasks.arith import ArithmeticError_, format_number, safe_eval

Example = dict[str, Any]


def _segments_to_demo(example: Example, template: PromptTemplate, segments) -> dict:
    merged: list[tuple[str, bool]] = []
    for text, trainable in segments:
        if not text:
            continue
        if merged and merged[-1][1] == trainable:
            merged[-1] = (merged[-1][0] + text, trainable)
        else:
            merged.append((text, trainable))
    return {
        "id": example["id"],
        "prompt": template.render(example["question"]),
        "completion": "".join(t for t, _ in merged),
        "segments": merged,
    }


def rewrite_calc_annotations(solution: str) -> list[tuple[str, bool]]:
    """Segments of a GSM8K solution with ``<<e=r>>`` rewritten into calculator calls.

    ``"16 - 3 = <<16-3=13>>13 eggs"`` -> ``[("16 - 3 = <calc>16-3</calc>", True),
    ("<result>13</result>", False), (" eggs", True)]``.
    """
    segments: list[tuple[str, bool]] = []
    pos = 0
    for match in CALC_ANNOTATION_RE.finditer(solution):
        expr = match.group(1).strip()
        segments.append((solution[pos : match.start()], True))
        after = match.end()
        visible = re.match(r"[-\d.,]+", solution[after:])
        try:
            value = format_number(safe_eval(expr))
        except ArithmeticError_:
            pos = after  # keep only the visible text that follows the annotation
            continue
        segments.append((f"<calc>{expr}</calc>", True))
        segments.append((f"<result>{value}</result>", False))
        if visible and safe_eval_or_none(visible.group(0).rstrip(".,")) == safe_eval_or_none(
            value
        ):
            after += len(visible.group(0).rstrip(".,"))
        pos = after
    segments.append((solution[pos:], True))
    return segments


def safe_eval_or_none(text: str):
    """`safe_eval` of a number string, or None when it is not one."""
    try:
        return safe_eval(text)
    except ArithmeticError_:
        return None


def gsm8k_calc_demos(examples: Sequence[Example], template: PromptTemplate) -> list[dict]:
    """Demos from GSM8K examples (``solution`` field, see `load_gsm8k`)."""
    demos = []
    for ex in examples:
        if "solution" not in ex:
            raise ValueError(f"gsm8k_calc_demos: example {ex.get('id')!r} has no 'solution'")
        demos.append(_segments_to_demo(ex, template, rewrite_calc_annotations(ex["solution"])))
    return demos


def answer_demos(
    examples: Sequence[Example], template: PromptTemplate, use_calculator: bool = False
) -> list[dict]:
    """Demos ``#### answer`` (optionally preceded by a calculator call on the question)."""
    demos = []
    for ex in examples:
        answer = str(ex["answer"])
        segments: list[tuple[str, bool]] = []
        if use_calculator:
            try:
                value = format_number(safe_eval(ex["question"]))
            except ArithmeticError_ as e:
                raise ValueError(
                    f"answer_demos: question of {ex.get('id')!r} is not a calculator "
                    f"expression ({e})"
                ) from None
            segments += [(f"<calc>{ex['question']}</calc>", True),
                         (f"<result>{value}</result>", False), ("\n", True)]
        segments.append((f"#### {answer}", True))
        demos.append(_segments_to_demo(ex, template, segments))
    return demos
