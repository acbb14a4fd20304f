"""Exact numeric scoring for tasks whose answers are plain numbers (``chain_sum``).

The answer is the text after the last ``####`` (`entr_jax.tasks.rewards.extract_answer`,
no last-number fallback); it is correct iff it is a plain decimal number
(`entr_jax.tasks.rewards.parse_plain_number`: commas, a leading ``$``, sign and leading
zeros allowed) whose exact value equals the gold answer's. Nothing else is judged
equivalent, so no math-verify worker is ever started: a malformed answer is simply wrong.
"""

from __future__ import annotations

from entr_jax.tasks.rewards import extract_answer, parse_plain_number


class ExactNumberScorer:
    """Scorer ``(response, example) -> (reward, info)`` (`entr_jax.tasks.env.Scorer`).

    ``reward`` is 1.0 when correct else 0.0; ``info`` has ``pred`` (extracted answer or
    None), ``method`` (``"hash"`` or ``"none"``) and ``correct``.

    Raises:
      ValueError: the example's gold ``answer`` is not a plain number.
    """

    def __call__(self, response: str, example: dict) -> tuple[float, dict]:
        gold = parse_plain_number(str(example["answer"]))
        if gold is None:
            raise ValueError(f"ExactNumberScorer: gold answer {example['answer']!r} of "
                             f"{example.get('id')!r} is not a plain number")
        extraction = extract_answer(response, fallback_last_number=False)
        pred = None if extraction.text is None else parse_plain_number(extraction.text)
        correct = pred is not None and pred == gold
        return float(correct), {"pred": extraction.text, "method": extraction.method,
                                "correct": correct}
