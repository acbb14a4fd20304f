"""The environment interface shared by single-turn tasks and tool-using (multi-turn) tasks.

An episode: ``prompt = env.reset(example)``; then per model turn
``observation, done, reward, info = env.step(model_text)``. The rollout runner
(`entr_jax.tasks.rollout`) tokenizes ``observation`` and appends it to the trajectory as
environment tokens (``loss_mask`` false) until ``done``.

Tool-call syntax (all tool environments): a call is an XML-like tag pair
``<NAME>ARGUMENT</NAME>`` with a lower-case identifier ``NAME`` — e.g. ``<calc>48/2</calc>``,
``<search>founder of Zorvex</search>``, ``<open>doc-12</open>``. Only the first call of a
turn is executed (the runner ends a turn at the closing tag of a known tool, see
``stop_strings``). The environment answers ``<result>...</result>`` or
``<error>...</error>``; these two tags and ``think``/``answer`` are reserved and never
treated as calls. A tag pair with any other unknown name is an unknown-tool error; an
opening tag of a known tool without its closing tag is a malformed call. A turn without
any call is the final answer.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Mapping, NamedTuple, Protocol, runtime_checkable

from entr_jax.data.templates import Prompt, PromptTemplate

Example = dict[str, Any]
Scorer = Callable[[str, Example], "tuple[float, dict]"]
RESERVED_TAGS = frozenset({"result", "error", "think", "answer"})
_TAG_PAIR_RE = re.compile(r"<([a-z_][a-z0-9_]*)>(.*?)</\1>", re.S)


class StepResult(NamedTuple):
    """Outcome of one model turn: ``(observation, done, reward, info)``.

    ``observation`` is the environment's text to append (None: nothing to append);
    ``reward`` is the episode reward and is read only when ``done``.
    """

    observation: str | None
    done: bool
    reward: float
    info: dict


@runtime_checkable
class Environment(Protocol):
    """One episode's environment. A fresh instance is made per episode.

    Attributes:
      stop_strings: the runner ends a model turn right after the first of these strings
        (e.g. ``"</calc>"``), discarding later tokens of that generation.
    """

    stop_strings: tuple[str, ...]

    def reset(self, example: Example) -> Prompt:
        """Initial prompt: chat messages (instruct models) or text (base models)."""
        ...

    def step(self, model_text: str) -> StepResult:
        """Consumes one model turn (decoded text of the policy tokens of that turn)."""
        ...


class ToolError(Exception):
    """Raised by a tool for a bad argument; its message is shown to the model."""


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """A parsed call: ``name``, ``argument`` and ``error`` (None when well-formed and known)."""

    name: str
    argument: str
    error: str | None = None


def parse_tool_call(text: str, tool_names: frozenset[str] | set[str]) -> ToolCall | None:
    """The first tool call in ``text`` (see the module docstring for the syntax), or None."""
    for match in _TAG_PAIR_RE.finditer(text):
        name, arg = match.group(1), match.group(2)
        if name in RESERVED_TAGS:
            continue
        if name not in tool_names:
            known = ", ".join(sorted(tool_names))
            return ToolCall(name, arg, f"unknown tool '{name}'; available: {known}")
        return ToolCall(name, arg.strip())
    for name in sorted(tool_names):
        if f"<{name}>" in text:
            return ToolCall(name, "", f"malformed call: '<{name}>' without '</{name}>'")
    return None


def truncate_text(text: str, max_chars: int) -> tuple[str, bool]:
    """``text`` cut to ``max_chars`` characters plus a marker; returns (text, was_cut)."""
    if len(text) <= max_chars:
        return text, False
    return text[:max_chars] + f"...[truncated {len(text) - max_chars} chars]", True


class SingleTurnEnv:
    """A one-step environment: the first model turn is scored and ends the episode."""

    stop_strings: tuple[str, ...] = ()

    def __init__(self, template: PromptTemplate, scorer: Scorer):
        self.template = template
        self.scorer = scorer
        self._example: Example | None = None

    def reset(self, example: Example) -> Prompt:
        self._example = example
        return self.template.render(example["question"])

    def step(self, model_text: str) -> StepResult:
        if self._example is None:
            raise RuntimeError("SingleTurnEnv.step called before reset")
        reward, info = self.scorer(model_text, self._example)
        return StepResult(None, True, float(reward), info)


class ToolEnv:
    """A multi-turn environment with text tools (see the module docstring for the syntax).

    Args:
      template: renders the example's question (its instruction should explain the tools).
      tools: tool name -> function ``(argument: str) -> str`` raising `ToolError`.
      scorer: ``(final_text, example) -> (reward, info)`` for the final answer turn.
      max_observation_chars: longer tool outputs are cut with a ``[truncated]`` marker.

    ``step`` info keys: ``tool_calls``, ``tool_errors``, ``observation_truncated`` (counts
    so far) and, on the final turn, the scorer's info.
    """

    def __init__(
        self,
        template: PromptTemplate,
        tools: Mapping[str, Callable[[str], str]],
        scorer: Scorer,
        max_observation_chars: int = 2000,
    ):
        bad = [n for n in tools if n in RESERVED_TAGS or not re.fullmatch(r"[a-z_][a-z0-9_]*", n)]
        if bad:
            raise ValueError(f"ToolEnv.tools: invalid or reserved tool names {bad}")
        if max_observation_chars < 1:
            raise ValueError(
                f"ToolEnv.max_observation_chars must be >= 1, got {max_observation_chars}"
            )
        self.template = template
        self.tools = dict(tools)
        self.scorer = scorer
        self.max_observation_chars = max_observation_chars
        self.stop_strings = tuple(f"</{name}>" for name in sorted(self.tools))
        self._example: Example | None = None
        self.counts = {"tool_calls": 0, "tool_errors": 0, "observation_truncated": 0}

    def reset(self, example: Example) -> Prompt:
        self._example = example
        self.counts = dict.fromkeys(self.counts, 0)
        return self.template.render(example["question"])

    def step(self, model_text: str) -> StepResult:
        if self._example is None:
            raise RuntimeError("ToolEnv.step called before reset")
        call = parse_tool_call(model_text, frozenset(self.tools))
        if call is None:
            reward, info = self.scorer(model_text, self._example)
            return StepResult(None, True, float(reward), dict(self.counts) | info)
        self.counts["tool_calls"] += 1
        if call.error is None:
            try:
                output = str(self.tools[call.name](call.argument))
            except ToolError as e:
                call = dataclasses.replace(call, error=str(e))
        if call.error is not None:
            self.counts["tool_errors"] += 1
            observation = f"<error>{call.error}</error>"
        else:
            output, cut = truncate_text(output, self.max_observation_chars)
            self.counts["observation_truncated"] += int(cut)
            observation = f"<result>{output}</result>"
        return StepResult(observation, False, 0.0, dict(self.counts))
