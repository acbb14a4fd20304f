"""One validation layer for ``/generate`` replies: every field is checked against the
request that was sent and against the model, before anything of the reply is used.

The reply's shape is SGLang's (`samplers.sglang_protocol`): ``{"text", "output_ids",
"meta_info"}`` with ``meta_info.output_token_logprobs`` ``[logprob, id, text|null]``
triples. Nothing wrong is passed on silently; each fault is retried, cut or masked, and
counted (keys `COUNTER_KEYS`, summed by the fleet into ``metrics()``):

* **The reply as a whole** (`MalformedResponse`: the request is retried, maybe on
  another server): no ``meta_info`` object, an unknown ``finish_reason``,
  ``completion_tokens`` that is not a count or exceeds the request's ``max_new_tokens``,
  ``meta_info.id`` naming another request than the ``rid`` sent, ``prompt_tokens`` other
  than the prompt's length, a ``weight_version`` that is not an integer >= 0, no
  ``output_token_logprobs`` list or more log-probs than tokens, ``output_ids`` whose
  length is not ``completion_tokens``.
* **Token ids** must be ints in ``[0, vocab_size)``. From the first id that is not (or is
  unknown: neither ``output_ids`` nor the triple gives it), the segment is cut and
  reported as an abort, so the fleet resumes sampling from the last valid token (a fresh
  draw given that prefix, still a sample of the same policy). ``tokens_invalid_id`` counts
  the ids out of range, ``tokens_dropped`` every token cut.
* **Log-probs** of kept tokens: missing, unreadable (SGLang's orjson writes NaN/inf as
  ``null``), paired with another id than ``output_ids``, or above `LOGP_TOLERANCE` (a
  probability above 1) give ``logp_mu = NaN`` (the batching step masks the token) and are
  counted (``tokens_missing_logprob``, ``tokens_malformed_logprob``,
  ``tokens_invalid_logprob``); a literal non-finite value is kept as it came and counted
  (``tokens_nonfinite_logprob``).
* **Entropies**: a server patched to report ``meta_info["output_token_entropy"]`` is used
  when every value lies in ``[0, log vocab_size]`` (within `LOGP_TOLERANCE`); otherwise
  they are counted (``tokens_invalid_entropy``) and the top-k estimate is used. A top-k
  row with a log-prob above `LOGP_TOLERANCE` or a total probability above 1 is
  unreadable; a token without a usable entropy gets ``logp_mu = NaN`` and is counted
  (``tokens_missing_entropy``). ``tokens_entropy_estimated`` counts the tokens whose
  entropy is the top-k estimate (`samplers.sglang_entropy`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from samplers.sglang_entropy import topk_entropy_bounds
from samplers.sglang_protocol import MalformedResponse, parse_weight_version

COUNTER_KEYS = (
    "tokens_missing_logprob",
    "tokens_malformed_logprob",
    "tokens_nonfinite_logprob",
    "tokens_invalid_logprob",
    "tokens_invalid_id",
    "tokens_missing_entropy",
    "tokens_invalid_entropy",
    "tokens_dropped",
    "tokens_entropy_estimated",
)

LOGP_TOLERANCE = 1e-3
"""Largest log-prob (nats) accepted as rounding of 0: SGLang's log-softmax of (b)f16 logits
in float32 is <= 0 up to ~1e-6; anything above this is a probability above 1."""


@dataclasses.dataclass(frozen=True)
class ReplyContext:
    """What a reply is checked against besides its request.

    Attributes:
      vocab_size: V, the model's output rows; token ids must lie in ``[0, V)``.
      top_k: ``top_logprobs_num`` requested (rows of the entropy estimate).
      initial_version: the version SGLang's startup ``weight_version`` ``"default"`` maps to.
    """

    vocab_size: int
    top_k: int
    initial_version: int


@dataclasses.dataclass
class Segment:
    """The part of one sample produced by one ``/generate`` reply.

    Attributes:
      token_ids: ``[r] int32`` generated ids, each in ``[0, vocab_size)``.
      logp: ``[r] float32`` log-prob of each id (NaN where unusable, see module doc).
      entropy: ``[r] float32`` full-vocabulary entropy (nats), engine value or estimate.
      entropy_halfwidth: ``[r] float32`` bound on ``|entropy - true entropy|``; 0 when
        the engine reported the entropy itself.
      version: integer policy version parsed from ``meta_info.weight_version``.
      finish_type: ``"stop"``, ``"length"`` or ``"abort"``.
      message: abort message (or the reason of a cut), else None.
      counts: per-reply counters, keys `COUNTER_KEYS`.
    """

    token_ids: np.ndarray
    logp: np.ndarray
    entropy: np.ndarray
    entropy_halfwidth: np.ndarray
    version: int
    finish_type: str
    message: str | None
    counts: dict[str, int]


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x)


def _triple(entry: Any) -> tuple[float | None, Any]:
    """``(logprob, id)`` of a ``[logprob, id, text]`` triple; None where unreadable."""
    if not isinstance(entry, (list, tuple)) or len(entry) < 2:
        return None, None
    return _number(entry[0]), entry[1]


def _top_row(entry: Any, k: int) -> np.ndarray | None:
    """``[k]`` log-probs of one position's top list (``-inf`` padded); None if unusable."""
    if not isinstance(entry, (list, tuple)) or len(entry) == 0:
        return None
    row = np.full(k, -np.inf)
    for j, item in enumerate(entry[:k]):
        lp, _ = _triple(item)
        if lp is None or lp > LOGP_TOLERANCE or (not math.isfinite(lp) and lp != -math.inf):
            return None
        row[j] = lp
    if np.logaddexp.reduce(row) > LOGP_TOLERANCE:  # more than all the probability
        return None
    return row


def _check_reply(meta: Any, obj: dict, request: dict[str, Any], ctx: ReplyContext):
    """The reply-level checks of the module doc; returns ``(n, finish, version, triples,
    output_ids or None)``."""
    if not isinstance(meta, dict):
        raise MalformedResponse("reply has no meta_info object")
    fr = meta.get("finish_reason")
    if isinstance(fr, str):
        fr = {"type": fr}
    if not isinstance(fr, dict) or fr.get("type") not in ("stop", "length", "abort"):
        raise MalformedResponse(f"unknown finish_reason {fr!r}")
    budget = int(request["sampling_params"]["max_new_tokens"])
    n = _count(meta.get("completion_tokens"))
    if n is None or not 0 <= n <= budget:
        raise MalformedResponse(f"completion_tokens {meta.get('completion_tokens')!r} is not a "
                                f"count in [0, max_new_tokens={budget}]")
    rid = meta.get("id")
    if isinstance(rid, str) and rid != request["rid"]:
        raise MalformedResponse(f"the reply is for request {rid!r}, not {request['rid']!r}")
    prompt = _count(meta.get("prompt_tokens"))
    if prompt is not None and prompt != len(request["input_ids"]):
        raise MalformedResponse(f"prompt_tokens {prompt} for a prompt of "
                                f"{len(request['input_ids'])} tokens")
    version = parse_weight_version(meta.get("weight_version"), ctx.initial_version)
    if version < 0:
        raise MalformedResponse(f"weight_version {meta.get('weight_version')!r} is negative")
    triples = meta.get("output_token_logprobs")
    if not isinstance(triples, list):
        raise MalformedResponse("meta_info.output_token_logprobs is missing")
    if len(triples) > n:
        raise MalformedResponse(f"{len(triples)} log-probs for {n} completion tokens")
    out_ids = obj.get("output_ids")
    if out_ids is not None and (not isinstance(out_ids, list) or len(out_ids) != n):
        got = len(out_ids) if isinstance(out_ids, list) else type(out_ids).__name__
        raise MalformedResponse(f"output_ids has {got} entries for {n} completion tokens")
    return n, fr, version, triples, out_ids


def parse_reply(obj: dict[str, Any], request: dict[str, Any], ctx: ReplyContext) -> Segment:
    """Check one decoded ``/generate`` reply against ``request`` (the payload sent) and the
    model (``ctx``), and turn it into a `Segment` (policy in the module doc).

    Raises:
      MalformedResponse: the reply as a whole cannot be used (module doc).
    """
    meta = obj.get("meta_info")
    n, fr, version, triples, out_ids = _check_reply(meta, obj, request, ctx)
    counts = dict.fromkeys(COUNTER_KEYS, 0)
    ids: list[int] = []
    logp: list[float] = []
    cut = None
    for i in range(n):
        has = i < len(triples)
        lp, tid = _triple(triples[i]) if has else (None, None)
        token = out_ids[i] if out_ids is not None else tid
        if _count(token) is None or not 0 <= token < ctx.vocab_size:
            if token is not None:
                counts["tokens_invalid_id"] += 1
                cut = f"token id {token!r} at position {i} is not in [0, {ctx.vocab_size})"
            else:
                cut = f"{n - i} tokens without readable ids"
            counts["tokens_dropped"] += n - i
            break
        if out_ids is not None and has and tid != token:  # a log-prob of another token
            lp = None
        if not has:
            counts["tokens_missing_logprob"] += 1
            lp = math.nan
        elif lp is None:  # includes NaN/inf, which SGLang's orjson writes as null
            counts["tokens_malformed_logprob"] += 1
            lp = math.nan
        elif not math.isfinite(lp):
            counts["tokens_nonfinite_logprob"] += 1
        elif lp > LOGP_TOLERANCE:
            counts["tokens_invalid_logprob"] += 1
            lp = math.nan
        ids.append(token)
        logp.append(lp)
    r = len(ids)
    entropy, halfwidth, estimated, invalid = _entropies(meta, r, ctx.top_k, ctx.vocab_size)
    missing_h = ~np.isfinite(entropy)
    counts["tokens_entropy_estimated"] = int(np.sum(estimated & ~missing_h))
    counts["tokens_missing_entropy"] = int(missing_h.sum())
    counts["tokens_invalid_entropy"] = invalid
    logp_r = np.where(missing_h, np.float32(np.nan), np.asarray(logp, np.float32))
    finish, message = fr["type"], fr.get("message")
    if cut is not None:
        finish, message = "abort", cut
    return Segment(
        token_ids=np.asarray(ids, np.int32),
        logp=logp_r.astype(np.float32),
        entropy=entropy,
        entropy_halfwidth=halfwidth,
        version=version,
        finish_type=finish,
        message=None if message is None else str(message),
        counts=counts,
    )


def _entropies(meta: dict[str, Any], r: int, top_k: int, vocab_size: int):
    """``(entropy [r] f32, halfwidth [r] f32, estimated [r] bool, invalid engine values)``:
    the engine's values when all are valid (``estimated`` false), else the top-k estimate
    and its bound (``estimated`` true)."""
    engine = meta.get("output_token_entropy")
    invalid = 0
    if isinstance(engine, list) and len(engine) >= r:
        vals = [_number(v) for v in engine[:r]]
        top = math.log(vocab_size) + LOGP_TOLERANCE
        ok = [v is not None and math.isfinite(v) and -LOGP_TOLERANCE <= v <= top for v in vals]
        if all(ok):
            return (np.asarray(vals, np.float32), np.zeros(r, np.float32), np.zeros(r, bool), 0)
        invalid = sum(not o for o in ok)
    tops = meta.get("output_top_logprobs")
    rows = np.full((r, top_k), -np.inf)
    for i in range(r):
        row = _top_row(tops[i], top_k) if isinstance(tops, list) and i < len(tops) else None
        rows[i] = row if row is not None else np.nan
    if r == 0:
        return np.zeros(0, np.float32), np.zeros(0, np.float32), np.zeros(0, bool), invalid
    est, lo, hi = topk_entropy_bounds(rows, vocab_size)
    return (est.astype(np.float32), (0.5 * (hi - lo)).astype(np.float32), np.ones(r, bool),
            invalid)
