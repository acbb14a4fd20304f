"""SGLang native ``/generate`` wire format: request payloads, reply bodies and versions.

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
  otherwise the entropy is estimated from ``output_top_logprobs`` (`sglang_entropy`).

Replies are checked field by field against the request and the model before use
(`samplers.sglang_reply`).
"""

from __future__ import annotations

import json
from typing import Any

from entr_jax.interfaces import SamplingParams


class MalformedResponse(ValueError):
    """A ``/generate`` reply that cannot be used at all (the request is retried)."""


def is_greedy(params: SamplingParams) -> bool:
    """``top_k == 1`` (with ``top_p == 1`` and ``min_p == 0``): greedy decoding."""
    return params.top_k == 1 and params.top_p == 1.0 and params.min_p == 0.0


def check_params_supported(params: SamplingParams) -> None:
    """Refuse sampling filters whose log-probs SGLang does not report; ``top_k=1`` alone
    (greedy decoding, `is_greedy`) is allowed.

    Raises:
      ValueError: naming the field when ``top_p < 1``, ``top_k`` other than -1 or 1, or
        ``min_p > 0``.
    """
    if is_greedy(params):
        return
    for name, off in (("top_p", 1.0), ("top_k", -1), ("min_p", 0.0)):
        if getattr(params, name) != off:
            raise ValueError(
                f"SamplingParams.{name}={getattr(params, name)} is not supported by the SGLang "
                "fleet: SGLang reports log-probs of the temperature-scaled distribution before "
                f"top-k/top-p/min-p filtering, so logp_mu would not be the sampled policy. "
                f"Use {name}={off} (or top_k=1 alone for greedy decoding)."
            )


def build_generate_payload(
    input_ids: list[int],
    params: SamplingParams,
    max_new_tokens: int,
    top_logprobs_num: int,
    sampling_seed: int | None,
    rid: str,
) -> dict[str, Any]:
    """The JSON body of one ``/generate`` call (one prompt, one sample, no streaming).

    Greedy decoding (`is_greedy`) is sent as ``temperature`` 0 with ``top_k`` 1: SGLang then
    takes the arg-max (the first of exactly tied tokens, so the same token whatever the
    seed), and reports log-probs at temperature 1. A tiny temperature instead would sample
    among exact ties, which bf16 logits (a 1/32-nat grid) make common."""
    sampling: dict[str, Any] = {
        "temperature": 0.0 if is_greedy(params) else float(params.temperature),
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
