"""SGLang native ``/generate`` wire format: request payloads and response parsing.

Facts about the SGLang native HTTP API this module relies on (SGLang docs "SGLang Native
APIs" and "Sampling Parameters"; ``python/sglang/srt/entrypoints/http_server.py``,
``managers/io_struct.py``, ``managers/schedule_batch.py`` in sgl-project/sglang):

* ``POST /generate`` takes ``input_ids`` (one prompt: ``list[int]``), ``sampling_params``
  (``temperature``, ``top_p``, ``top_k`` with -1 = off, ``min_p``, ``max_new_tokens``,
  ``stop_token_ids``, ``n``, ``no_stop_trim``, ``skip_special_tokens``, ``ignore_eos``,
  ``sampling_seed``), ``return_logprob``, ``logprob_start_len`` (-1: output tokens only),
  ``top_logprobs_num``, ``return_text_in_logprobs`` and ``rid``.
* The reply is ``{"text", "output_ids", "meta_info"}``; ``meta_info`` holds ``id``,
  ``finish_reason``, ``prompt_tokens``, ``completion_tokens``, ``weight_version`` (a
  string, ``"default"`` until a weight update names one), ``output_token_logprobs``
  (one ``[logprob, token_id, text_or_null]`` triple per generated token) and, when asked,
  ``output_top_logprobs`` (per token, a list of such triples).
* ``finish_reason`` is ``{"type": "stop", "matched": id_or_str}``, ``{"type": "length",
  "length": N}`` or ``{"type": "abort", "message": ..., ...}``.
* The returned log-probs are ``log_softmax(logits / temperature)`` *before* top-k/top-p/
  min-p filtering (unless the server sets ``SGLANG_RETURN_ORIGINAL_LOGPROB``, which must
  stay unset). They equal the sampled distribution only without filters, so the fleet
  refuses filtering parameters (`check_params_supported`).
* Stock SGLang has no request option that returns per-token entropy; a server patched to
  put ``meta_info["output_token_entropy"]`` (one float per token) is used when present,
  otherwise the entropy is estimated from ``output_top_logprobs`` (`sglang_entropy`); the
  count of such estimated tokens is ``counts["tokens_entropy_estimated"]``.

Malformed data is never silently trained on: a token whose log-prob (or entropy) is
missing or unreadable gets ``logp_mu = NaN`` (the batching step masks non-finite
``logp_mu``) and is counted; engine-reported NaN/inf log-probs are kept as they came and
counted (SGLang serialises with orjson, which writes NaN/inf as ``null``: those arrive as
unreadable and are counted as malformed). When the ids of the unreadable tail are
unknown, the segment is truncated before it and reported as an abort, so the fleet
resumes sampling from the last known token (a fresh draw given that prefix, which is still
a sample of the same policy).
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import numpy as np

from entr_jax.interfaces import SamplingParams
from samplers.sglang_entropy import topk_entropy_bounds

COUNTER_KEYS = (
    "tokens_missing_logprob",
    "tokens_malformed_logprob",
    "tokens_nonfinite_logprob",
    "tokens_missing_entropy",
    "tokens_dropped",
    "tokens_entropy_estimated",
)


class MalformedResponse(ValueError):
    """A ``/generate`` reply that cannot be used at all (the request is retried)."""


@dataclasses.dataclass
class Segment:
    """The part of one sample produced by one ``/generate`` reply.

    Attributes:
      token_ids: ``[r] int32`` generated ids.
      logp: ``[r] float32`` log-prob of each id (NaN where unreadable, see module doc).
      entropy: ``[r] float32`` full-vocabulary entropy estimate (nats).
      entropy_halfwidth: ``[r] float32`` bound on ``|entropy - true entropy|``; 0 when
        the engine reported the entropy itself.
      version: integer policy version parsed from ``meta_info.weight_version``.
      finish_type: ``"stop"``, ``"length"`` or ``"abort"``.
      message: abort message (or truncation reason), else None.
      counts: per-reply counters, keys `COUNTER_KEYS` (``tokens_entropy_estimated``: tokens
        whose entropy is the top-k estimate, not an engine value).
    """

    token_ids: np.ndarray
    logp: np.ndarray
    entropy: np.ndarray
    entropy_halfwidth: np.ndarray
    version: int
    finish_type: str
    message: str | None
    counts: dict[str, int]


def check_params_supported(params: SamplingParams) -> None:
    """Refuse sampling filters whose log-probs SGLang does not report.

    Raises:
      ValueError: naming the field when ``top_p < 1``, ``top_k != -1`` or ``min_p > 0``.
    """
    for name, off in (("top_p", 1.0), ("top_k", -1), ("min_p", 0.0)):
        if getattr(params, name) != off:
            raise ValueError(
                f"SamplingParams.{name}={getattr(params, name)} is not supported by the SGLang "
                "fleet: SGLang reports log-probs of the temperature-scaled distribution before "
                f"top-k/top-p/min-p filtering, so logp_mu would not be the sampled policy. "
                f"Use {name}={off}."
            )


def build_generate_payload(
    input_ids: list[int],
    params: SamplingParams,
    max_new_tokens: int,
    top_logprobs_num: int,
    sampling_seed: int | None,
    rid: str,
) -> dict[str, Any]:
    """The JSON body of one ``/generate`` call (one prompt, one sample, no streaming)."""
    sampling: dict[str, Any] = {
        "temperature": float(params.temperature),
        "top_p": float(params.top_p),
        "top_k": int(params.top_k),
        "min_p": float(params.min_p),
        "max_new_tokens": int(max_new_tokens),
        "stop_token_ids": [int(t) for t in params.stop_token_ids],
        "n": 1,
        "ignore_eos": False,
        "no_stop_trim": True,
        "skip_special_tokens": False,
    }
    if sampling_seed is not None:
        sampling["sampling_seed"] = int(sampling_seed)
    return {
        "input_ids": [int(t) for t in input_ids],
        "sampling_params": sampling,
        "return_logprob": True,
        "logprob_start_len": -1,
        "top_logprobs_num": int(top_logprobs_num),
        "return_text_in_logprobs": False,
        "rid": rid,
        "stream": False,
    }


def parse_weight_version(value: Any, initial_version: int) -> int:
    """Map SGLang's string ``weight_version`` to the integer policy version.

    ``None`` or ``"default"`` (SGLang's startup value) -> ``initial_version``; a decimal
    string or an int -> that int (the fleet always pushes ``str(version)``).

    Raises:
      MalformedResponse: for anything else.
    """
    if value is None or value == "default":
        return initial_version
    if isinstance(value, bool):
        raise MalformedResponse(f"weight_version {value!r} is not an integer version")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    raise MalformedResponse(f"weight_version {value!r} is not an integer version")


def _number(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x)


def _triple(entry: Any) -> tuple[float | None, int | None]:
    """``(logprob, token_id)`` of a ``[logprob, id, text]`` triple; None where unreadable."""
    if not isinstance(entry, (list, tuple)) or len(entry) < 2:
        return None, None
    tid = entry[1] if isinstance(entry[1], int) and not isinstance(entry[1], bool) else None
    return _number(entry[0]), tid


def _top_row(entry: Any, k: int) -> np.ndarray | None:
    """``[k]`` log-probs of one position's top list (``-inf`` padded); None if unreadable."""
    if not isinstance(entry, (list, tuple)) or len(entry) == 0:
        return None
    row = np.full(k, -np.inf)
    for j, item in enumerate(entry[:k]):
        lp, _ = _triple(item)
        if lp is None or not math.isfinite(lp) and lp != -math.inf:
            return None
        row[j] = lp
    return row


def decode_body(raw: bytes) -> dict[str, Any]:
    """Parse a reply body; a one-element list (``n = 1`` batch form) is unwrapped.

    Raises:
      MalformedResponse: if it is not JSON or not an object.
    """
    try:
        obj = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise MalformedResponse(f"reply is not JSON: {e}") from None
    if isinstance(obj, list) and len(obj) == 1:
        obj = obj[0]
    if not isinstance(obj, dict):
        raise MalformedResponse(f"reply is a {type(obj).__name__}, expected an object")
    return obj


def parse_generate_reply(
    obj: dict[str, Any], top_k: int, vocab_size: int, initial_version: int
) -> Segment:
    """Turn one decoded ``/generate`` reply into a `Segment` (see module doc for policy).

    Raises:
      MalformedResponse: when the reply has no usable ``meta_info``, ``finish_reason``,
        ``completion_tokens``, ``weight_version`` or ``output_token_logprobs``, or reports
        more log-probs than tokens.
    """
    meta = obj.get("meta_info")
    if not isinstance(meta, dict):
        raise MalformedResponse("reply has no meta_info object")
    fr = meta.get("finish_reason")
    if isinstance(fr, str):
        fr = {"type": fr}
    if not isinstance(fr, dict) or fr.get("type") not in ("stop", "length", "abort"):
        raise MalformedResponse(f"unknown finish_reason {fr!r}")
    n = meta.get("completion_tokens")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise MalformedResponse(f"completion_tokens {n!r} is not a count")
    version = parse_weight_version(meta.get("weight_version"), initial_version)
    triples = meta.get("output_token_logprobs")
    if not isinstance(triples, list):
        raise MalformedResponse("meta_info.output_token_logprobs is missing")
    if len(triples) > n:
        raise MalformedResponse(f"{len(triples)} log-probs for {n} completion tokens")
    out_ids = obj.get("output_ids")
    ids_known = (
        isinstance(out_ids, list) and len(out_ids) == n
        and all(isinstance(t, int) and not isinstance(t, bool) for t in out_ids)
    )
    counts = dict.fromkeys(COUNTER_KEYS, 0)
    ids: list[int] = []
    logp: list[float] = []
    for i in range(n):
        has = i < len(triples)
        lp, tid = _triple(triples[i]) if has else (None, None)
        if ids_known:
            token = out_ids[i]
            if has and tid != token:  # unreadable id or id disagreeing with output_ids
                lp = None
        elif tid is None:  # id of this and later tokens unknown: truncate, resume later
            counts["tokens_dropped"] += n - i
            break
        else:
            token = tid
        if not has:
            counts["tokens_missing_logprob"] += 1
            lp = math.nan
        elif lp is None:  # includes NaN/inf, which SGLang's orjson writes as null
            counts["tokens_malformed_logprob"] += 1
            lp = math.nan
        elif not math.isfinite(lp):
            counts["tokens_nonfinite_logprob"] += 1
        ids.append(token)
        logp.append(lp)
    r = len(ids)
    logp_r = np.asarray(logp, np.float32)
    entropy, halfwidth, estimated = _entropies(meta, r, top_k, vocab_size)
    missing_h = ~np.isfinite(entropy)
    counts["tokens_entropy_estimated"] = int(np.sum(estimated & ~missing_h))
    counts["tokens_missing_entropy"] = int(missing_h.sum())
    logp_r = np.where(missing_h, np.float32(np.nan), logp_r).astype(np.float32)
    finish, message = fr["type"], fr.get("message")
    if counts["tokens_dropped"]:
        finish, message = "abort", f"{counts['tokens_dropped']} tokens without readable ids"
    return Segment(
        token_ids=np.asarray(ids, np.int32),
        logp=logp_r,
        entropy=entropy,
        entropy_halfwidth=halfwidth,
        version=version,
        finish_type=finish,
        message=None if message is None else str(message),
        counts=counts,
    )


def _entropies(meta: dict[str, Any], r: int, top_k: int, vocab_size: int):
    """``(entropy [r] f32, halfwidth [r] f32, estimated [r] bool)``: engine values if given
    (``estimated`` false), else the top-k estimate and its bound (``estimated`` true)."""
    engine = meta.get("output_token_entropy")
    if isinstance(engine, list) and len(engine) >= r:
        vals = [_number(v) for v in engine[:r]]
        if all(v is not None and math.isfinite(v) for v in vals):
            return np.asarray(vals, np.float32), np.zeros(r, np.float32), np.zeros(r, bool)
    tops = meta.get("output_top_logprobs")
    rows = np.full((r, top_k), -np.inf)
    for i in range(r):
        row = _top_row(tops[i], top_k) if isinstance(tops, list) and i < len(tops) else None
        rows[i] = row if row is not None else np.nan
    if r == 0:
        return np.zeros(0, np.float32), np.zeros(0, np.float32), np.zeros(0, bool)
    est, lo, hi = topk_entropy_bounds(rows, vocab_size)
    return est.astype(np.float32), (0.5 * (hi - lo)).astype(np.float32), np.ones(r, bool)
