"""A Hugging Face tokenizer directory loaded without `transformers`.

Reads the files a HF model directory ships: ``tokenizer.json`` (run by the `tokenizers`
library), ``tokenizer_config.json`` (special tokens, ``chat_template``),
``chat_template.jinja`` when present (it takes precedence over the config's template, as
in transformers) and ``generation_config.json`` (extra eos ids). Chat templates are
rendered with `jinja2` in a sandbox configured like transformers' (``trim_blocks``,
``lstrip_blocks``, ``loopcontrols``, ``raise_exception``, ``tojson``, ``strftime_now``),
so ``encode`` and ``apply_chat_template`` agree with ``transformers.AutoTokenizer`` on
the same directory (tests/test_tokenizer.py checks this).

Not reproduced: transformers' ``clean_up_tokenization_spaces`` post-step of ``decode``
(Qwen-family directories set it to false); it is reported by
`Tokenizer.clean_up_tokenization_spaces` so a caller can tell.
"""

from __future__ import annotations

import datetime
import functools
import json
import pathlib
from typing import Any, Mapping, Sequence

import jinja2
import jinja2.ext
import jinja2.sandbox
import tokenizers

from entr_jax.file_errors import BadFileError, about_file, read_json_object

__all__ = ["Tokenizer"]


def _token_content(value: Any, file: pathlib.Path, name: str) -> str | None:
    """A special-token entry of tokenizer_config.json: a string, an AddedToken dict or null."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    raise BadFileError(file, f"{name} must be a token string, an AddedToken object or null, "
                             f"got {value!r}")


def _ids(value: Any, file: pathlib.Path, name: str) -> list[int]:
    """An int or a list of ints of generation_config.json (None: none)."""
    ids = [] if value is None else [value] if not isinstance(value, list) else value
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise BadFileError(file, f"{name} must be a token id >= 0 or a list of them, got "
                                 f"{value!r}")
    return ids


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: Any = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


@functools.lru_cache(maxsize=16)
def _compile_template(source: str) -> jinja2.Template:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


class Tokenizer:
    """Text <-> token ids and chat formatting for one HF tokenizer directory.

    Build with `Tokenizer.from_pretrained` (a directory path). Attributes:

      eos_token_ids: every id that ends a generation, in order and without repeats:
        tokenizer_config's ``eos_token`` first, then ``generation_config.json``'s
        ``eos_token_id`` (int or list) when that file exists. May be empty.
      eos_token_id: the first of ``eos_token_ids`` or None.
      pad_token_id: id of tokenizer_config's ``pad_token``, else generation_config's
        ``pad_token_id``, else None.
      bos_token_id: id of tokenizer_config's ``bos_token`` or None.
      vocab_size: number of token ids including added/special tokens (``len`` of the
        transformers tokenizer); the model's embedding may be larger (padded).
      chat_template: the Jinja source, or None if the directory has none.
      clean_up_tokenization_spaces: the config flag; `decode` does not apply it.
    """

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        special_tokens: Mapping[str, str | None],
        additional_special_tokens: Sequence[str] = (),
        chat_template: str | None = None,
        generation_eos_token_ids: Sequence[int] = (),
        generation_pad_token_id: int | None = None,
        clean_up_tokenization_spaces: bool = False,
    ):
        self.backend = backend
        self.special_tokens = dict(special_tokens)
        self.additional_special_tokens = list(additional_special_tokens)
        self.chat_template = chat_template
        self.clean_up_tokenization_spaces = bool(clean_up_tokenization_spaces)

        eos_ids: list[int] = []
        eos = self.special_tokens.get("eos_token")
        if eos is not None:
            eos_ids.append(self._required_id(eos, "eos_token"))
        for i in generation_eos_token_ids:
            if i not in eos_ids:
                eos_ids.append(int(i))
        self.eos_token_ids: tuple[int, ...] = tuple(eos_ids)
        self.eos_token_id: int | None = eos_ids[0] if eos_ids else None

        pad = self.special_tokens.get("pad_token")
        self.pad_token_id: int | None = (
            self._required_id(pad, "pad_token") if pad is not None else generation_pad_token_id
        )
        bos = self.special_tokens.get("bos_token")
        self.bos_token_id: int | None = self._required_id(bos, "bos_token") if bos is not None else None
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)

    def _required_id(self, token: str, field: str) -> int:
        token_id = self.backend.token_to_id(token)
        if token_id is None:
            raise ValueError(f"{field} {token!r} is not in tokenizer.json's vocabulary")
        return token_id

    @classmethod
    def from_pretrained(cls, path: str | pathlib.Path) -> Tokenizer:
        """Load a HF tokenizer directory.

        Args:
          path: directory holding ``tokenizer.json`` (required), ``tokenizer_config.json``,
            optionally ``chat_template.jinja`` and ``generation_config.json``.

        Raises:
          FileNotFoundError: the directory or its ``tokenizer.json`` is missing.
          entr_jax.file_errors.BadFileError: a file that cannot be used (not a tokenizer,
            not JSON, a malformed special token or eos/pad id, a special token that is not
            in the vocabulary), naming the file and what is wrong.
        """
        root = pathlib.Path(path)
        tokenizer_file = root / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise FileNotFoundError(f"no tokenizer.json in {root}")
        with about_file(tokenizer_file, "not a tokenizers file"):
            backend = tokenizers.Tokenizer.from_file(str(tokenizer_file))

        config_file = root / "tokenizer_config.json"
        config = read_json_object(config_file) if config_file.is_file() else {}
        special = {
            name: _token_content(config.get(name), config_file, name)
            for name in ("bos_token", "eos_token", "pad_token", "unk_token")
        }
        extra = config.get("additional_special_tokens") or []
        if not isinstance(extra, list):
            raise BadFileError(config_file, f"additional_special_tokens must be a list, got "
                                            f"{type(extra).__name__}")
        additional = [
            t for t in (_token_content(v, config_file, "additional_special_tokens")
                        for v in extra) if t is not None
        ]

        template_file = root / "chat_template.jinja"
        template = config.get("chat_template")
        if template_file.is_file():
            with about_file(template_file, "not UTF-8 text"):
                template = template_file.read_text(encoding="utf-8")
        elif isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
            template = named.get("default")
        if template is not None and not isinstance(template, str):
            raise BadFileError(config_file, f"chat_template must be a string, got "
                                            f"{type(template).__name__}")

        gen_eos: list[int] = []
        gen_pad = None
        gen_file = root / "generation_config.json"
        if gen_file.is_file():
            gen = read_json_object(gen_file)
            gen_eos = _ids(gen.get("eos_token_id"), gen_file, "eos_token_id")
            pad = _ids(gen.get("pad_token_id"), gen_file, "pad_token_id")
            if len(pad) > 1:
                raise BadFileError(gen_file, f"pad_token_id must be one id, got {pad}")
            gen_pad = pad[0] if pad else None

        with about_file(config_file, "a special token does not match tokenizer.json"):
            return cls(
                backend,
                special_tokens=special,
                additional_special_tokens=additional,
                chat_template=template,
                generation_eos_token_ids=gen_eos,
                generation_pad_token_id=gen_pad,
                clean_up_tokenization_spaces=config.get("clean_up_tokenization_spaces", False),
            )

    def __len__(self) -> int:
        return self.vocab_size

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``. ``add_special_tokens`` applies tokenizer.json's
        post-processor (e.g. a BOS), as transformers' ``encode`` does by default; special
        token strings inside ``text`` (e.g. ``<|im_end|>``) always map to their ids."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        """Text of ``ids`` (any int sequence or 1-D array); special tokens are dropped
        when ``skip_special_tokens``."""
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        """Id of a token string, or None if it is not in the vocabulary."""
        return self.backend.token_to_id(token)

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tokenize: bool = False,
        **template_kwargs: Any,
    ) -> str | list[int]:
        """Render a conversation with the directory's chat template.

        Args:
          messages: ``[{"role": ..., "content": ...}, ...]``.
          add_generation_prompt: append the opening of an assistant turn.
          tokenize: return token ids (of the rendered text, without post-processor
            specials, as transformers does) instead of the text.
          template_kwargs: extra template variables (e.g. ``tools``, ``enable_thinking``).

        Raises:
          ValueError: the directory has no chat template.
          jinja2.TemplateError: the template rejected the messages.
        """
        if self.chat_template is None:
            raise ValueError("this tokenizer directory has no chat_template")
        context = {k: v for k, v in self.special_tokens.items()}
        context["additional_special_tokens"] = self.additional_special_tokens
        context.update(template_kwargs)
        context["messages"] = [dict(m) for m in messages]
        context["add_generation_prompt"] = add_generation_prompt
        text = _compile_template(self.chat_template).render(**context)
        if tokenize:
            return self.encode(text, add_special_tokens=False)
        return text
