"""Calculator tool environment (GSM8K and the arithmetic sources).

Syntax: the model writes ``<calc>EXPRESSION</calc>`` (e.g. ``<calc>48/2</calc>``) and the
environment appends ``<result>24</result>`` (or ``<error>division by zero</error>``). The
expression is evaluated by `entr_jax.tasks.arith.safe_eval` (``ast``, exact rationals,
only numbers, ``+ - * / ** % //``, unary minus and parentheses, bounded exponent and
magnitude; never ``eval``). The final answer is ``#### n`` or ``\\boxed{n}``, scored by
the verifier.
"""

from __future__ import annotations

from entr_jax.data.templates import PromptTemplate
from entr_jax.tasks.arith import ArithLimits, ArithmeticError_, format_number, safe_eval
from entr_jax.tasks.env import Scorer, ToolEnv, ToolError

CALC_INSTRUCTION = (
    "You can use a calculator: write <calc>EXPRESSION</calc> (numbers, + - * / ** % // and "
    "parentheses) and the result is returned as <result>VALUE</result>. "
    "End your answer with a line '#### <number>'."
)


def calculator_tool(limits: ArithLimits = ArithLimits()):
    """The calculator as a tool function ``(expression) -> formatted result``."""

    def calc(expression: str) -> str:
        try:
            return format_number(safe_eval(expression, limits))
        except ArithmeticError_ as e:
            raise ToolError(str(e)) from None

    return calc


def make_calculator_env(
    scorer: Scorer,
    template: PromptTemplate | None = None,
    limits: ArithLimits = ArithLimits(),
    max_observation_chars: int = 200,
) -> ToolEnv:
    """A fresh calculator `ToolEnv` (tool name ``calc``) for one episode."""
    template = template or PromptTemplate(instruction=CALC_INSTRUCTION)
    return ToolEnv(template, {"calc": calculator_tool(limits)}, scorer, max_observation_chars)
