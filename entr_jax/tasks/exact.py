"""Exact numeric scoring for tasks whose answers are plain numbers (``chain_sum``,
``arithmetic``).

The answer is the text after the last ``####`` (`entr_jax.tasks.rewards.extract_answer`;
with ``fallback_last_number`` the last number of the response when there is no marker);
it is correct iff it is a plain decimal number (`entr_jax.tasks.rewards.parse_plain_number`:
commas, a leading ``$``, sign and leading zeros allowed) whose exact value equals the gold
answer's. This is `entr_jax.tasks.rewards.MathVerifier`'s fast path alone: nothing else
is judged equivalent (``#### 48/2`` for 24 is wrong, where math-verify would accept the
expression), so no math-verify worker process is ever started.
"""

from __future__ import annotations

from entr_jax.tasks.rewards import extract_answer, parse_plain_number


class ExactNumberScorer:
    """Scorer ``(response, example) -> (reward, info)`` (`entr_jax.tasks.env.Scorer`).

    Args:
      fallback_last_number: take the last number of the response when it has no ``####``
        (or ``\\boxed{}``) answer, as `entr_jax.tasks.rewards.RewardConfig` does.

    ``reward`` is 1.0 when correct else 0.0; ``info`` has ``pred`` (extracted answer or
    None), ``method`` (``"hash"``, ``"boxed"``, ``"last_number"`` or ``"none"``) and
    ``correct``.

    Raises:
      ValueError: the example's gold ``answer`` is not a plain number.
    """

    def __init__(self, fallback_last_number: bool = False):
        self.fallback_last_number = fallback_last_number

    def __call__(self, response: str, example: dict) -> tuple[float, dict]:
        gold = parse_plain_number(str(example["answer"]))
        if gold is None:
            raise ValueError(f"ExactNumberScorer: gold answer {example['answer']!r} of "
                             f"{example.get('id')!r} is not a plain number")
        extraction = extract_answer(response, fallback_last_number=self.fallback_last_number)
        pred = None if extraction.text is None else parse_plain_number(extraction.text)
        correct = pred is not None and pred == gold
        return float(correct), {"pred": extraction.text, "method": extraction.method,
                                "correct": correct}
