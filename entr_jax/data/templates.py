"""Prompt templates: chat messages for instruct models, plain text for base models.

A template turns an example's question into either a list of chat messages (rendered
later by the tokenizer's ``apply_chat_template``) or a plain string (``encode``d as is).
`encode_prompt` does that last step for both.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, Union

Messages = list[dict[str, str]]
Prompt = Union[str, Messages]

MATH_INSTRUCTION = "Reason step by step, and put your final answer within \\boxed{}."
GSM8K_INSTRUCTION = "Solve the problem. End your answer with a line '#### <number>'."


@dataclasses.dataclass(frozen=True)
class PromptTemplate:
    """How a question becomes a prompt.

    Attributes:
      style: ``"chat"`` (messages for ``apply_chat_template``) or ``"plain"`` (a string).
      instruction: appended to the question (after a blank line); may be empty.
      system: optional system message (chat style only).
      plain_format: format of the plain style with ``{question}`` and ``{instruction}``.
    """

    style: Literal["chat", "plain"] = "chat"
    instruction: str = MATH_INSTRUCTION
    system: str | None = None
    plain_format: str = "Question: {question}\n{instruction}\nAnswer:"

    def __post_init__(self):
        if self.style not in ("chat", "plain"):
            raise ValueError(f"PromptTemplate.style must be 'chat' or 'plain', got {self.style!r}")
        if "{question}" not in self.plain_format:
            raise ValueError("PromptTemplate.plain_format must contain '{question}'")
        if self.system is not None and self.style == "plain":
            raise ValueError("PromptTemplate.system is only used with style='chat'")

    def render(self, question: str) -> Prompt:
        """The prompt for one question: messages (chat) or text (plain)."""
        if self.style == "plain":
            return self.plain_format.format(question=question, instruction=self.instruction)
        content = f"{question}\n\n{self.instruction}" if self.instruction else question
        messages: Messages = []
        if self.system is not None:
            messages.append({"role": "system", "content": self.system})
        messages.append({"role": "user", "content": content})
        return messages


def encode_prompt(tokenizer: Any, prompt: Prompt) -> list[int]:
    """Token ids of a prompt: ``apply_chat_template`` for messages, ``encode`` for text.

    ``tokenizer`` needs ``encode(text) -> list[int]`` and ``apply_chat_template(messages,
    add_generation_prompt=True, tokenize=True) -> list[int]`` (``entr_jax.tokenizer``).
    """
    if isinstance(prompt, str):
        return [int(t) for t in tokenizer.encode(prompt)]
    if isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt):
        ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
        return [int(t) for t in ids]
    raise TypeError(f"prompt must be str or a list of message dicts, got {type(prompt).__name__}")
