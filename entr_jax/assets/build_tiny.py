"""Rebuild the embedded tiny model directory ``entr_jax/assets/tiny/`` (HF layout, no weights).

Usage (from the repository root)::

    python -m entr_jax.assets.build_tiny            # writes entr_jax/assets/tiny/
    python -m entr_jax.assets.build_tiny --out DIR  # writes elsewhere

Data: GSM8K train questions and answers (shipped with the package) plus MATH-500
problems, found by `entr_jax.data.files.locate` (``--data-dir`` or ``$ENTR_DATA_DIR``, the
user cache, else a checksum-checked download; ``entr-data fetch math500`` fetches it ahead
of time).

What it writes, deterministically (same data => byte-identical files):

* ``tokenizer.json``: byte-level BPE trained with the ``tokenizers`` library, vocabulary
  `VOCAB_SIZE` (= 1024) including the special tokens `SPECIAL_TOKENS`; every digit is
  its own pre-token, so numbers are tokenised digit by digit.
* ``tokenizer_config.json``: special tokens, eos/pad, and a ChatML-style ``chat_template``.
* ``config.json``: a tiny Qwen2 (``Qwen2ForCausalLM``) decoder, a few million parameters,
  tied embeddings, vocabulary = tokenizer vocabulary rounded up to a multiple of 64.
* ``generation_config.json``: bos/eos/pad ids (eos = ``<|im_end|>`` and ``<|endoftext|>``).

Weights are not stored: the training job initialises them from a seed.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
from typing import Iterator

from entr_jax.data.files import locate
from entr_jax.data.sources import read_jsonl

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

VOCAB_SIZE = 1024
ENDOFTEXT, IM_START, IM_END, PAD = "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END, PAD]  # ids 0, 1, 2, 3

# ChatML: each turn is "<|im_start|>{role}\n{content}<|im_end|>\n"; the generation prompt
# opens an assistant turn.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)

# Qwen2's pre-tokenization, written out because `transformers` (5.x) loads every
# ``model_type == "qwen2"`` directory with its Qwen2Tokenizer, which installs exactly this
# NFC normaliser and split pattern whatever tokenizer.json says; the `tokenizers` library
# and transformers then agree only if the file carries the same pipeline. Alternatives, in
# order: English contractions (any case); an optional non-letter/non-digit followed by a
# run of letters; ONE digit (numbers become digit-level tokens); an optional space and a
# run of punctuation with trailing newlines; whitespace ending in newlines; whitespace not
# followed by a non-space; any other whitespace.
PRETOKENIZE_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
    r"|[^\r\n\p{L}\p{N}]?\p{L}+"
    r"|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+"
    r"|\s+(?!\S)"
    r"|\s+"
)

MODEL_SHAPE = dict(
    hidden_size=256,
    intermediate_size=768,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=32,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
)


def training_texts(data_dir: str | os.PathLike | None = None) -> Iterator[str]:
    """GSM8K train question and answer texts, then MATH-500 problem texts, in file order.

    Both files are found by `locate` (``data_dir`` first, None: ``$ENTR_DATA_DIR``); raises
    `entr_jax.data.files.DataNotFoundError` naming what was tried when one is missing.
    """
    gsm8k = read_jsonl(locate("gsm8k/train.jsonl", data_dir).path)
    math500 = read_jsonl(locate("math500/test.jsonl", data_dir).path)
    for row in gsm8k:
        yield row["question"]
        yield row["answer"]
    for row in math500:
        yield row["problem"]


def train_tokenizer(texts: Iterator[str]) -> Tokenizer:
    """Byte-level BPE with Qwen2 pre-tokenisation (single-digit pre-tokens) and the four
    special tokens as ids 0-3."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def build(out_dir: pathlib.Path, data_dir: str | os.PathLike | None = None) -> None:
    """Train the tokenizer on the data (see `training_texts`) and write the four files
    into ``out_dir``."""
    tok = train_tokenizer(training_texts(data_dir))
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    if [ids[t] for t in SPECIAL_TOKENS] != [0, 1, 2, 3]:
        raise RuntimeError(f"special tokens got unexpected ids {ids}")
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"), pretty=False)

    tokenizer_config = {
        "tokenizer_class": "Qwen2Tokenizer",  # what transformers loads for qwen2 anyway
        "bos_token": None,
        "eos_token": IM_END,
        "pad_token": PAD,
        "unk_token": None,
        "additional_special_tokens": [ENDOFTEXT, IM_START, IM_END],
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MODEL_SHAPE["max_position_embeddings"],
        "padding_side": "right",
    }
    config = {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "vocab_size": _round_up(vocab_size, 64),
        **MODEL_SHAPE,
        "hidden_act": "silu",
        "attention_bias": True,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "tie_word_embeddings": True,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": MODEL_SHAPE["num_hidden_layers"],
        "rope_scaling": None,
        "use_cache": True,
        "bos_token_id": ids[ENDOFTEXT],
        "eos_token_id": ids[IM_END],
        "pad_token_id": ids[PAD],
        "torch_dtype": "float32",
    }
    generation_config = {
        "bos_token_id": ids[ENDOFTEXT],
        "eos_token_id": [ids[IM_END], ids[ENDOFTEXT]],
        "pad_token_id": ids[PAD],
    }
    for name, obj in (
        ("tokenizer_config.json", tokenizer_config),
        ("config.json", config),
        ("generation_config.json", generation_config),
    ):
        (out_dir / name).write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path(__file__).parent / "tiny")
    parser.add_argument("--data-dir", type=pathlib.Path, default=None,
                        help="data folder looked up first (default: $ENTR_DATA_DIR)")
    args = parser.parse_args(argv)
    build(args.out, args.data_dir)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
