"""Rollout runner: drives any `entr_jax.interfaces.Sampler` over episodes, turn by turn.

Per turn, all active episodes go to the sampler in ONE ``generate`` call (turn 0: the P
distinct prompts with ``num_samples=G``; later turns: each episode's context with
``num_samples=1``). Each generation is cut

1. to the episode's remaining token budget (``max_total_tokens`` counts response tokens:
   policy + environment; the cut generation gets ``finish_reason="length"``), and
2. right after the first of the environment's ``stop_strings`` (e.g. ``"</calc>"``; the
   rest is discarded, ``finish_reason="stop"``; a prefix of a sample is a sample of that
   prefix, so the recorded ``logp_mu`` stay exact),

appended as policy tokens (``loss_mask`` true), decoded (without a final EOS token of
``tokenizer.eos_token_ids``, which stays in the trajectory) and passed to ``env.step``. A
returned observation is tokenized with ``tokenizer.encode`` and appended as environment
tokens (``loss_mask`` false, ``logp_mu = entropy_mu = 0``, ``token_version = -1``), cut to
``max_observation_tokens`` and to the remaining budget. An episode that is not done after
``max_turns`` turns, or whose budget runs out, is *truncated* and gets reward 0.

The seed of turn ``t`` is ``params.seed + 1_000_003 * t`` so turns do not repeat samples.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import numpy as np

from entr_jax.data.templates import encode_prompt
from entr_jax.interfaces import Sampler, SamplingParams
from entr_jax.tasks.env import Environment
from entr_jax.types import BehaviorParams, Generation, Trajectory

_TURN_SEED_STRIDE = 1_000_003


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    """Bounds of an episode.

    Attributes:
      max_turns: model turns per episode (>= 1; 1 for single-turn tasks).
      max_total_tokens: response tokens (policy + environment) per episode (>= 1).
      max_observation_tokens: tokens of one observation kept (>= 1).
    """

    max_turns: int = 1
    max_total_tokens: int = 1024
    max_observation_tokens: int = 256

    def __post_init__(self):
        for name in ("max_turns", "max_total_tokens", "max_observation_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"RolloutConfig.{name} must be >= 1, got {getattr(self, name)}")


@dataclasses.dataclass
class _Episode:
    env: Environment
    example: dict
    group_id: int
    prompt_ids: list[int]
    ids: list[int] = dataclasses.field(default_factory=list)
    logp: list[float] = dataclasses.field(default_factory=list)
    entropy: list[float] = dataclasses.field(default_factory=list)
    version: list[int] = dataclasses.field(default_factory=list)
    mask: list[bool] = dataclasses.field(default_factory=list)
    turns: int = 0
    done: bool = False
    truncated: bool = False
    reward: float = 0.0
    finish_reason: str = "stop"
    info: dict = dataclasses.field(default_factory=dict)

    def append(self, ids, logp, entropy, version, policy: bool) -> None:
        self.ids += [int(t) for t in ids]
        self.logp += [float(x) for x in logp]
        self.entropy += [float(x) for x in entropy]
        self.version += [int(v) for v in version]
        self.mask += [policy] * len(ids)


def stop_cut(ids: Sequence[int], stop_strings: Sequence[str], decode: Callable) -> int | None:
    """Smallest ``k`` such that ``decode(ids[:k])`` contains a stop string, else None.

    Binary search (O(log R) decodes); assumes containment is monotone in ``k``.
    """
    if not stop_strings or not any(s in decode(list(ids)) for s in stop_strings):
        return None
    lo, hi = 1, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if any(s in decode(list(ids[:mid])) for s in stop_strings):
            hi = mid
        else:
            lo = mid + 1
    return lo


def run_episodes(
    sampler: Sampler,
    tokenizer: Any,
    env_factory: Callable[[], Environment],
    examples: Sequence[dict],
    params: SamplingParams,
    num_samples: int = 1,
    config: RolloutConfig = RolloutConfig(),
    group_ids: Sequence[int] | None = None,
) -> list[Trajectory]:
    """Runs ``len(examples) * num_samples`` episodes and returns their trajectories.

    Args:
      sampler: any `Sampler` (used only through ``generate``).
      tokenizer: ``encode``, ``decode``, ``apply_chat_template`` (see `encode_prompt`).
      env_factory: makes a fresh environment per episode.
      examples: P example dicts (each with ``id`` and whatever the environment reads).
      params: sampling parameters; ``max_new_tokens`` is lowered to the largest remaining
        budget of the active episodes, the seed varies per turn (module docstring), and
        empty ``stop_token_ids`` are filled with ``tokenizer.eos_token_ids``.
      num_samples: G samples per example.
      config: episode bounds.
      group_ids: ``group_id`` of example p's samples is ``group_ids[p]`` (P ints; default
        ``p``).

    Returns:
      Trajectories in example-major order (example 0's G samples first), each with
      ``reward``, ``group_id``, ``finish_reason`` of the last generation, ``behavior``
      (``params``' temperature and filters, which every turn shares) and ``info``:
      ``example_id``, ``turns``, ``tool_calls``, ``tool_errors``, ``truncated`` plus the
      environment's last info.
    """
    if num_samples < 1:
        raise ValueError(f"run_episodes: num_samples must be >= 1, got {num_samples}")
    if not examples:
        raise ValueError("run_episodes: examples must not be empty")
    if group_ids is None:
        group_ids = range(len(examples))
    if len(group_ids) != len(examples):
        raise ValueError(f"run_episodes: group_ids has {len(group_ids)} entries for "
                         f"{len(examples)} examples")
    if not params.stop_token_ids and getattr(tokenizer, "eos_token_ids", None):
        params = dataclasses.replace(
            params, stop_token_ids=tuple(int(t) for t in tokenizer.eos_token_ids)
        )
    episodes: list[_Episode] = []
    first_prompts: list[list[int]] = []
    for p, example in enumerate(examples):
        for g in range(num_samples):
            env = env_factory()
            prompt_ids = encode_prompt(tokenizer, env.reset(example))
            if g == 0:
                first_prompts.append(prompt_ids)
            episodes.append(_Episode(env, example, int(group_ids[p]), prompt_ids))
    for turn in range(config.max_turns):
        active = [e for e in episodes if not e.done]
        if not active:
            break
        budget = max(config.max_total_tokens - len(e.ids) for e in active)
        turn_params = dataclasses.replace(
            params,
            max_new_tokens=max(1, min(params.max_new_tokens, budget)),
            seed=(params.seed + _TURN_SEED_STRIDE * turn) % (2**31 - 1),
        )
        if turn == 0:
            out = sampler.generate(first_prompts, turn_params, num_samples=num_samples)
            _check_shape(out, len(first_prompts), num_samples)
            gens = [gen for per_prompt in out for gen in per_prompt]
        else:
            out = sampler.generate([e.prompt_ids + e.ids for e in active], turn_params, 1)
            _check_shape(out, len(active), 1)
            gens = [per_prompt[0] for per_prompt in out]
        for episode, gen in zip(active, gens):
            _advance(episode, gen, tokenizer, config)
    for e in episodes:
        if not e.done:
            e.truncated, e.reward = True, 0.0
    behavior = BehaviorParams(params.temperature, params.top_k, params.top_p, params.min_p)
    return [_to_trajectory(e, behavior) for e in episodes]


def _check_shape(out, num_prompts: int, num_samples: int) -> None:
    if len(out) != num_prompts or any(len(o) != num_samples for o in out):
        raise ValueError(
            f"sampler.generate returned {[len(o) for o in out]} generations for "
            f"{num_prompts} prompts x {num_samples} samples"
        )


def _advance(e: _Episode, gen: Generation, tokenizer: Any, config: RolloutConfig) -> None:
    """Appends one generation (cut as in the module docstring) and steps the environment."""
    room = config.max_total_tokens - len(e.ids)
    n, finish = len(gen.response_ids), gen.finish_reason
    if n > room:
        n, finish = room, "length"
    cut = stop_cut(gen.response_ids[:n], e.env.stop_strings, tokenizer.decode)
    if cut is not None and cut < n:
        n, finish = cut, "stop"
    e.append(gen.response_ids[:n], gen.logp_mu[:n], gen.entropy_mu[:n], gen.token_version[:n], True)
    e.finish_reason = finish
    e.turns += 1
    text_ids = [int(t) for t in gen.response_ids[:n]]
    if text_ids and text_ids[-1] in set(getattr(tokenizer, "eos_token_ids", ())):
        text_ids.pop()  # the stop token ends the turn; it is trained on, not read as text
    text = tokenizer.decode(text_ids)
    observation, done, reward, info = e.env.step(text)
    e.info.update(info)
    if done:
        e.done, e.reward = True, float(reward)
        return
    if observation is not None:
        obs_ids = [int(t) for t in tokenizer.encode(observation)]
        keep = min(len(obs_ids), config.max_observation_tokens)
        room = config.max_total_tokens - len(e.ids)
        if keep > room:
            keep = room
            e.done, e.truncated = True, True
        zeros = [0.0] * keep
        e.append(obs_ids[:keep], zeros, zeros, [-1] * keep, False)
    if len(e.ids) >= config.max_total_tokens:
        e.done, e.truncated = True, True


def _to_trajectory(e: _Episode, behavior: BehaviorParams) -> Trajectory:
    info = dict(e.info)
    info.update(
        example_id=e.example.get("id"), turns=e.turns,
        tool_calls=info.get("tool_calls", 0), tool_errors=info.get("tool_errors", 0),
        truncated=e.truncated,
    )
    return Trajectory(
        prompt_ids=np.asarray(e.prompt_ids, np.int32),
        response_ids=np.asarray(e.ids, np.int32),
        logp_mu=np.asarray(e.logp, np.float32),
        entropy_mu=np.asarray(e.entropy, np.float32),
        token_version=np.asarray(e.version, np.int32),
        loss_mask=np.asarray(e.mask, bool),
        reward=0.0 if e.truncated else e.reward,
        group_id=e.group_id,
        finish_reason=e.finish_reason,
        info=info,
        behavior=behavior,
    )
