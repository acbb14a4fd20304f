"""Tests for entr_jax.tokenizer and the embedded tiny model directory (entr_jax/assets/tiny).

transformers (the `hf` extra, installed in CI) is the reference: encode, decode and chat
templates must agree exactly on the same local directory.
"""

import json
import shutil
from collections.abc import Mapping

import jinja2
import pytest

from entr_jax.assets import build_tiny, tiny_dir
from entr_jax.data.sources import read_data
from entr_jax.tokenizer import Tokenizer

transformers = pytest.importorskip("transformers")

MESSAGES = [
    {"role": "system", "content": "Solve the problem step by step."},
    {"role": "user", "content": "What is 12 * 34?\nAnswer with a number."},
    {"role": "assistant", "content": "12 * 34 = 408.\n#### 408"},
    {"role": "user", "content": "And 408 / 4? ünïcödé 🙂"},
]


@pytest.fixture(scope="module")
def ours():
    return Tokenizer.from_pretrained(tiny_dir())


@pytest.fixture(scope="module")
def hf():
    return transformers.AutoTokenizer.from_pretrained(str(tiny_dir()))


@pytest.fixture(scope="module")
def texts():
    sample = [
        "",
        " ",
        "Hello\n\n  world\t\tIT'S it's  ",
        "ünïcödé 日本語 🙂 e\u0301",  # the last is NFD: the NFC normaliser must merge it
        "<|im_start|>user\nhi<|im_end|>\n<|endoftext|><|pad|>",
        "$\\frac{14}{3}$ and 1,234,567.89 or -0.5e10",
    ]
    for row in read_data("gsm8k/train.jsonl")[:100]:  # ships with the package
        sample += [row["question"], row["answer"]]
    return sample


def test_encode_decode_match_transformers(ours, hf, texts):
    for text in texts:
        ids = ours.encode(text)
        assert ids == hf.encode(text), text
        assert ours.encode(text, add_special_tokens=False) == hf.encode(text, add_special_tokens=False)
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(
                ids, skip_special_tokens=skip
            ), text


def test_chat_template_matches_transformers(ours, hf):
    for n in (1, 2, 4):
        for gen in (True, False):
            text = ours.apply_chat_template(MESSAGES[:n], add_generation_prompt=gen)
            ref = hf.apply_chat_template(MESSAGES[:n], add_generation_prompt=gen, tokenize=False)
            assert text == ref
            ids = ours.apply_chat_template(MESSAGES[:n], add_generation_prompt=gen, tokenize=True)
            ref_ids = hf.apply_chat_template(MESSAGES[:n], add_generation_prompt=gen, tokenize=True)
            ref_ids = ref_ids["input_ids"] if isinstance(ref_ids, Mapping) else ref_ids
            assert ids == list(ref_ids)


def test_chat_template_golden(ours):
    text = ours.apply_chat_template([{"role": "user", "content": "2+2?"}])
    assert text == "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    ids = ours.apply_chat_template([{"role": "user", "content": "2+2?"}], tokenize=True)
    assert ids[0] == 1 and ids.count(2) == 1 and ids[-1] == ours.encode("\n")[0]


def test_special_ids_and_sizes(ours, hf):
    assert ours.eos_token_ids == (2, 0)  # <|im_end|> (tokenizer_config), <|endoftext|> (generation_config)
    assert ours.eos_token_id == hf.eos_token_id == 2
    assert ours.pad_token_id == hf.pad_token_id == 3
    assert ours.bos_token_id is None
    assert ours.vocab_size == len(hf) == len(ours) == build_tiny.VOCAB_SIZE
    for i, tok in enumerate(build_tiny.SPECIAL_TOKENS):
        assert ours.token_to_id(tok) == i
        assert ours.encode(tok) == [i]


def test_digits_are_single_tokens(ours):
    ids = ours.encode("31415926")
    assert len(ids) == 8
    assert [ours.decode([i]) for i in ids] == list("31415926")
    assert ours.decode(ours.encode(" x = 1234")) == " x = 1234"


def test_tiny_config_loads_as_qwen2(ours):
    config = transformers.AutoConfig.from_pretrained(str(tiny_dir()))
    assert config.model_type == "qwen2" and config.architectures == ["Qwen2ForCausalLM"]
    assert config.vocab_size % 64 == 0 and config.vocab_size >= ours.vocab_size
    assert (config.hidden_size, config.num_hidden_layers) == (256, 4)
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (8, 4, 32)
    assert config.intermediate_size == 768 and config.tie_word_embeddings
    assert config.max_position_embeddings == 512 and config.rms_norm_eps == 1e-6
    raw = json.loads((tiny_dir() / "config.json").read_text())
    assert raw["rope_theta"] == 10000.0
    assert (raw["bos_token_id"], raw["eos_token_id"], raw["pad_token_id"]) == (0, 2, 3)
    gen = json.loads((tiny_dir() / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [2, 0] and gen["pad_token_id"] == 3


def test_tiny_assets_small():
    total = sum(p.stat().st_size for p in tiny_dir().iterdir())
    assert total < 1_000_000
    names = sorted(p.name for p in tiny_dir().iterdir())
    assert names == [
        "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"
    ]


def test_build_tiny_reproduces_committed_assets(tmp_path):
    build_tiny.build(tmp_path)  # GSM8K train from the package, MATH-500 via the data lookup
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json", "generation_config.json"):
        assert (tmp_path / name).read_bytes() == (tiny_dir() / name).read_bytes(), name


def test_generation_config_and_dict_tokens(tmp_path):
    shutil.copy(tiny_dir() / "tokenizer.json", tmp_path / "tokenizer.json")
    config = json.loads((tiny_dir() / "tokenizer_config.json").read_text())
    config["eos_token"] = {"content": "<|endoftext|>", "special": True}
    config["pad_token"] = None
    del config["chat_template"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [2, 0, 1], "pad_token_id": 0})
    )
    (tmp_path / "chat_template.jinja").write_text("{{ messages[0]['content'] }}|{{ eos_token }}")
    tok = Tokenizer.from_pretrained(tmp_path)
    assert tok.eos_token_ids == (0, 2, 1)
    assert tok.pad_token_id == 0  # from generation_config when tokenizer_config has none
    assert tok.apply_chat_template([{"role": "user", "content": "x"}]) == "x|<|endoftext|>"
    (tmp_path / "chat_template.jinja").unlink()
    with pytest.raises(ValueError, match="chat_template"):
        Tokenizer.from_pretrained(tmp_path).apply_chat_template(MESSAGES)


def test_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        Tokenizer.from_pretrained(tmp_path)
    shutil.copy(tiny_dir() / "tokenizer.json", tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|nope|>"}))
    with pytest.raises(ValueError, match="eos_token"):
        Tokenizer.from_pretrained(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": "{{ raise_exception('bad role') }}"})
    )
    with pytest.raises(jinja2.TemplateError, match="bad role"):
        Tokenizer.from_pretrained(tmp_path).apply_chat_template(MESSAGES)
