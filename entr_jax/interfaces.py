"""The small protocols through which learners, samplers and experiments meet.

`learners` and `samplers` never import each other; both depend on these protocols and
are wired together in `experiments` (``docs/design.md``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, Sequence, runtime_checkable

from entr_jax.types import Generation


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Explicit sampling parameters, sent as-is to every sampler.

    Attributes:
      temperature: softmax temperature (> 0). ``logp_mu``/``entropy_mu`` are taken from the
        tempered (and filtered) distribution that was actually sampled from.
      top_p: nucleus mass in (0, 1]; 1 disables it (the RL default).
      top_k: keep the k most likely tokens; -1 disables it (the RL default).
      min_p: minimum probability relative to the mode; 0 disables it.
      max_new_tokens: per-call generation budget (>= 1).
      stop_token_ids: generation ends after any of these (all EOS ids of the tokenizer).
      seed: base seed; the sampler derives per-request keys from it deterministically.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    max_new_tokens: int = 64
    stop_token_ids: tuple[int, ...] = ()
    seed: int = 0

    def __post_init__(self):
        if not self.temperature > 0:
            raise ValueError(f"SamplingParams.temperature must be > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"SamplingParams.top_k must be -1 or >= 1, got {self.top_k}")
        if not 0 <= self.min_p < 1:
            raise ValueError(f"SamplingParams.min_p must be in [0, 1), got {self.min_p}")
        if self.max_new_tokens < 1:
            raise ValueError(
                f"SamplingParams.max_new_tokens must be >= 1, got {self.max_new_tokens}"
            )


@runtime_checkable
class Sampler(Protocol):
    """Anything that turns prompt token ids into `Generation`s with behavior statistics.

    Implementations: ``samplers.jax_sampler.JaxSampler`` (embedded default) and
    ``samplers.sglang_fleet.SGLangFleet`` (a fleet of SGLang servers).
    """

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, num_samples: int = 1
    ) -> list[list[Generation]]:
        """Sample ``num_samples`` continuations of every prompt.

        Returns a list with one entry per prompt, each a list of ``num_samples``
        `Generation`s, in prompt order. Every prompt is answered exactly once.
        """
        ...

    def update_weights(self, params: Any, version: int) -> None:
        """Install new policy weights tagged with ``version`` (used for later tokens)."""
        ...

    def pause(self) -> None:
        """Stop admitting new decode steps (in-flight requests hold at a step boundary)."""
        ...

    def resume(self) -> None:
        """Undo `pause`."""
        ...
