"""Data types shared by samplers, environments, the staleness queue and the learner.

Conventions (``docs/design.md``, "One batch layout"):

* ``tokens: [B, L] int32`` holds prompt + response, right-padded.
* Every per-token RL array is ``[B, T]`` with ``T = L - 1`` and is aligned to the
  *target* token: index ``t`` describes ``tokens[:, t + 1]`` given ``tokens[:, :t + 1]``.
* ``loss_mask`` is true only on tokens the policy generated (never prompt, tool output
  or padding).
* Names follow the papers: ``logp_mu``/``entropy_mu`` (behavior = sampler policy mu),
  ``logp_prox`` (proximal policy of decoupled PPO), ``logp_ref`` (reference policy),
  ``logp_pi`` (current policy, the only quantity with gradient), ``token_version``
  (policy version of the weights that generated a token), ``staleness = version -
  token_version``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import jax
import numpy as np
from flax import struct

FinishReason = Literal["stop", "length", "abort"]

BATCH_ROW_FIELDS = (
    "tokens", "attention_mask", "loss_mask", "advantages", "logp_mu", "entropy_mu",
    "entropy_mu_valid", "token_version", "logp_prox", "logp_ref",
)
"""The `Batch` fields with a row axis (all but the scalar ``num_loss_tokens``)."""


@dataclasses.dataclass(frozen=True)
class BehaviorParams:
    """The sampling parameters of the distribution ``mu`` a trajectory's policy tokens were
    drawn from (those of `entr_jax.interfaces.SamplingParams` that shape it), so that
    whoever scores the tokens can score the same distribution (`learners.learner.Learner`
    refuses a mismatch).

    Attributes:
      temperature: softmax temperature.
      top_k, top_p, min_p: the filters (-1 / 1 / 0 = off).
    """

    temperature: float
    top_k: int = -1
    top_p: float = 1.0
    min_p: float = 0.0

    @classmethod
    def of(cls, params: Any) -> "BehaviorParams":
        """The distribution-shaping fields of ``params`` (an
        `entr_jax.interfaces.SamplingParams`)."""
        return cls(float(params.temperature), int(params.top_k), float(params.top_p),
                   float(params.min_p))


@dataclasses.dataclass
class Generation:
    """One sampled continuation, as every `Sampler` returns it (host-side numpy).

    Attributes:
      prompt_ids: ``[P] int32`` the token ids the continuation was conditioned on.
      response_ids: ``[R] int32`` generated token ids (stop token included when one was hit).
      logp_mu: ``[R] float32`` natural-log probability of each generated token under the
        exact distribution it was sampled from (after temperature and any top-k/top-p
        filtering). Non-finite values reported by an engine are kept as they came; the
        batching step counts and masks them.
      entropy_mu: ``[R] float32`` full-vocabulary Shannon entropy (nats) of that same
        distribution at each position.
      token_version: ``[R] int32`` policy version of the weights that produced each token.
      finish_reason: ``"stop"`` (stop token or stop string), ``"length"`` (max new
        tokens) or ``"abort"``.
      behavior: the sampling parameters it was drawn with (`BehaviorParams`: temperature
        and the top-k / top-p / min-p filters), or None when the sampler does not say;
        `Trajectory.from_generation` carries it, so a learner scores (or refuses) the
        distribution the tokens came from.
    """

    prompt_ids: np.ndarray
    response_ids: np.ndarray
    logp_mu: np.ndarray
    entropy_mu: np.ndarray
    token_version: np.ndarray
    finish_reason: FinishReason
    behavior: BehaviorParams | None = None

    def __post_init__(self):
        n = len(self.response_ids)
        for name in ("logp_mu", "entropy_mu", "token_version"):
            if len(getattr(self, name)) != n:
                raise ValueError(
                    f"Generation.{name} has {len(getattr(self, name))} entries but "
                    f"response_ids has {n}"
                )


@dataclasses.dataclass
class Trajectory:
    """A complete (possibly multi-turn) episode for one prompt sample (host-side numpy).

    The response part interleaves policy tokens (``loss_mask`` true) with environment /
    tool tokens (``loss_mask`` false, ``logp_mu = 0``, ``entropy_mu = 0``,
    ``token_version = -1``).

    Attributes:
      prompt_ids: ``[P] int32``.
      response_ids: ``[R] int32``.
      logp_mu, entropy_mu: ``[R] float32`` (see `Generation`).
      token_version: ``[R] int32``; ``-1`` on environment tokens.
      loss_mask: ``[R] bool``; true only on policy-generated tokens.
      reward: scalar sequence reward ``R_i``.
      group_id: index of the prompt this sample belongs to (P prompts x G samples).
      finish_reason: of the last generation.
      info: free-form per-episode metadata (answer, number of turns, tool errors, ...).
      behavior: the sampling parameters the policy tokens were drawn with
        (`BehaviorParams`), or None when unknown (e.g. demonstrations).
    """

    prompt_ids: np.ndarray
    response_ids: np.ndarray
    logp_mu: np.ndarray
    entropy_mu: np.ndarray
    token_version: np.ndarray
    loss_mask: np.ndarray
    reward: float = 0.0
    group_id: int = 0
    finish_reason: FinishReason = "stop"
    info: dict[str, Any] = dataclasses.field(default_factory=dict)
    behavior: BehaviorParams | None = None

    @classmethod
    def from_generation(cls, gen: Generation, **kwargs) -> "Trajectory":
        """Single-turn trajectory: every response token is a policy token; it carries the
        generation's ``behavior`` (``kwargs`` replace any field)."""
        kwargs.setdefault("behavior", gen.behavior)
        return cls(
            prompt_ids=np.asarray(gen.prompt_ids, np.int32),
            response_ids=np.asarray(gen.response_ids, np.int32),
            logp_mu=np.asarray(gen.logp_mu, np.float32),
            entropy_mu=np.asarray(gen.entropy_mu, np.float32),
            token_version=np.asarray(gen.token_version, np.int32),
            loss_mask=np.ones(len(gen.response_ids), bool),
            finish_reason=gen.finish_reason,
            **kwargs,
        )


@struct.dataclass
class Batch:
    """One learner batch on device, read by objectives through these attributes only.

    Shapes: ``B`` rows (sequences), ``L`` tokens per row, ``T = L - 1`` target positions.

    Attributes:
      tokens: ``[B, L] int32`` prompt + response, right-padded with ``pad_id``.
      attention_mask: ``[B, L] bool`` true on real (non-padding) tokens.
      loss_mask: ``[B, T] bool`` true on policy-generated target tokens.
      advantages: ``[B, T] float32`` per-token advantage ``A_{i,t}`` (0 off the mask).
      logp_mu: ``[B, T] float32`` behavior log-prob of the target token (0 off the mask).
      entropy_mu: ``[B, T] float32`` full-vocabulary behavior entropy (nats); 0 where the
        sampler reported a non-finite value (see ``entropy_mu_valid``).
      token_version: ``[B, T] int32`` policy version that generated each target token.
      logp_prox: ``[B, T] float32`` proximal-policy log-prob (the policy before the first
        optimizer update on this rollout batch), or None when the objective does not
        need it.
      logp_ref: ``[B, T] float32`` reference-policy log-prob, or None (no KL term).
      num_loss_tokens: ``[] float32`` loss tokens of the batch as counted on the host (for
        reports); the learner step counts its normalisers on device from ``loss_mask``
        (`learners.accumulate`), or None.
      entropy_mu_valid: ``[B, T] bool`` true where ``entropy_mu`` is a finite value from
        the sampler, or None (all valid). Loss tokens with an unknown entropy stay in the
        loss of objectives that do not read ``entropy_mu`` and are excluded from entropy
        diagnostics.
    """

    tokens: jax.Array
    attention_mask: jax.Array
    loss_mask: jax.Array
    advantages: jax.Array
    logp_mu: jax.Array
    entropy_mu: jax.Array
    token_version: jax.Array
    logp_prox: jax.Array | None = None
    logp_ref: jax.Array | None = None
    num_loss_tokens: jax.Array | None = None
    entropy_mu_valid: jax.Array | None = None


@struct.dataclass
class ObjectiveInput:
    """What an objective reads besides ``logp_pi``: ``loss, metrics = objective(logp_pi,
    inputs)`` (`entr_jax.objectives`). Frozen; built by the learner for each microbatch
    (`learners.accumulate.view`) and for the whole optimizer batch.

    Shapes: ``B`` rows of this (micro)batch, ``T`` target positions (``logp_pi``'s
    ``[B, T]``); every ``[B, T]`` array is aligned to the target token (`Batch`).

    Attributes:
      loss_mask: ``[B, T] bool`` true on policy-generated target tokens.
      advantages: ``[B, T] float32`` per-token advantage ``A_{i,t}``.
      logp_mu: ``[B, T] float32`` behavior log-prob of the target token.
      entropy_mu: ``[B, T] float32`` full-vocabulary behavior entropy (nats).
      logp_prox: ``[B, T] float32`` proximal-policy log-prob, or None (not read).
      logp_ref: ``[B, T] float32`` reference-policy log-prob, or None (no KL term).
      entropy_pi: ``[B, T] float32`` entropy of pi (detached), or None.
      num_loss_tokens: ``[] float32`` loss tokens of the whole optimizer batch (the
        normaliser every microbatch shares), or None: counted on this batch.
      num_sequences: ``[] float32`` rows of the optimizer batch with at least one loss
        token, or None: counted on this batch.
      batch_stats: ``{name: [] f32 or [B, ...]}`` statistics of the current policy over
        the whole optimizer batch (``objective.batch_stats``, sliced to these rows), or
        None: the objective computes them on this batch.
    """

    loss_mask: jax.Array
    advantages: jax.Array
    logp_mu: jax.Array
    entropy_mu: jax.Array
    logp_prox: jax.Array | None = None
    logp_ref: jax.Array | None = None
    entropy_pi: jax.Array | None = None
    num_loss_tokens: jax.Array | None = None
    num_sequences: jax.Array | None = None
    batch_stats: dict[str, jax.Array] | None = None
