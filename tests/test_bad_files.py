"""A damaged or mismatched file is refused before any work, through the real command line:
exit status 2, one paragraph that starts with the file's path and says what is wrong (never
"a bug?"), and the fix in the first paragraph where one is known."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file, save_file

from entr_jax.assets import tiny_dir
from entr_jax.model import Decoder, ModelConfig, save_pretrained

QUICK = ["--sft.steps", "0", "--rl_steps", "1", "--task.eval_examples", "2",
         "--task.eval_samples", "1", "--task.prompts_per_step", "2",
         "--task.samples_per_prompt", "2"]
BIAS = "model.layers.1.self_attn.k_proj.bias"
# QUICK's single RL step cannot get the preset's lag: the job warns so (preflight.lag_horizon);
# these tests are about files, and expect that warning
pytestmark = pytest.mark.filterwarnings(
    "ignore:only 0 of rl_steps=1 steps get the configured lag:UserWarning")


def _weights(model, edit):
    file = model / "model.safetensors"
    tensors = load_file(str(file))
    save_file(edit(tensors), str(file), metadata={"format": "pt"})
    return file


def _json(model, name, edit):
    file = model / name
    file.write_text(json.dumps(edit(json.loads(file.read_text()))))
    return file


def _text(model, name, text):
    (model / name).write_text(text)
    return model / name


# case -> (damage(model dir) -> the file at fault, what the message says after "<file>: ")
MODEL_CASES = {
    "missing tensor": (lambda m: _weights(m, lambda t: {k: v for k, v in t.items() if k != BIAS}),
                       f"tensor '{BIAS}' is missing (config.json describes a qwen2 model: "
                       "weights of another architecture?)"),
    "int32 tensor": (lambda m: _weights(m, lambda t: dict(t, **{BIAS: t[BIAS].astype(np.int32)})),
                     f"tensor '{BIAS}' has dtype I32; weights must be floating point"),
    "shape mismatch": (lambda m: _weights(m, lambda t: dict(t, **{BIAS: t[BIAS][:3]})),
                       f"tensor '{BIAS}' has shape (3,), expected (16,) by config.json"),
    "architecture mismatch": (
        lambda m: (_json(m, "config.json", lambda c: dict(
            c, architectures=["LlamaForCausalLM"], model_type="llama")),
            m / "model.safetensors")[1],
        "unexpected tensors in the checkpoint: ['model.layers.0.self_attn.k_proj.bias'"),
    "garbage tokenizer.json": (lambda m: _text(m, "tokenizer.json", '{"model": 7}'),
                               "not a tokenizers file ("),
    "garbage tokenizer_config.json": (lambda m: _text(m, "tokenizer_config.json", "{oops"),
                                      "not valid JSON (line 1, column 2: "),
    "garbage generation_config.json": (lambda m: _text(m, "generation_config.json", "\xff\x00"),
                                       "not valid JSON (line 1, column 1: "),
    "eos id of the wrong type": (
        lambda m: _json(m, "generation_config.json", lambda c: dict(c, eos_token_id="abc")),
        "eos_token_id must be a token id >= 0 or a list of them, got 'abc'"),
    "special token of the wrong type": (
        lambda m: _json(m, "tokenizer_config.json", lambda c: dict(c, eos_token=5)),
        "eos_token must be a token string, an AddedToken object or null, got 5"),
    "safetensors index without a weight map": (
        lambda m: _text(m, "model.safetensors.index.json", '{"weight_map": []}'),
        "field 'weight_map' is missing or not an object of file names"),
}


@pytest.mark.parametrize("case", sorted(MODEL_CASES))
def test_a_bad_model_or_tokenizer_file_is_refused_naming_it(case, small_model_dir, tmp_path,
                                                            entr_run):
    model = tmp_path / "model"
    shutil.copytree(small_model_dir, model)
    damage, problem = MODEL_CASES[case]
    file = damage(model)
    run_dir = tmp_path / "run"
    code, err = entr_run(["quickstart", "--run_dir", str(run_dir), "--model.path", str(model),
                          *QUICK])
    assert code == 2, err
    assert err.startswith(f"entr-run: error: {file}: {problem}"), err
    assert "a bug?" not in err and "Traceback" not in err
    assert not run_dir.exists()


def test_a_tokenizer_larger_than_the_models_vocabulary_is_refused(tmp_path, entr_run):
    """A model whose embedding has 500 rows with the 1024-token tokenizer: ids >= 500 would
    embed as NaN."""
    model = tmp_path / "model"
    hf = json.loads((tiny_dir() / "config.json").read_text())
    hf.update(vocab_size=500, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
              num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    save_pretrained(Decoder(ModelConfig.from_hf_config(hf), rngs=nnx.Rngs(0)), str(model))
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(tiny_dir() / name, model / name)
    run_dir = tmp_path / "run"
    code, err = entr_run(["quickstart", "--run_dir", str(run_dir), "--model.path", str(model),
                          *QUICK])
    assert (code, err) == (2, f"entr-run: error: {model}/tokenizer.json: 1024 tokens, but "
                              "config.json's vocab_size is 500: ids >= 500 would have no "
                              "embedding row (the tokenizer of another model?)")
    assert not run_dir.exists()


def test_nan_weights_are_refused_before_any_evaluation(small_model_dir, tmp_path, entr_run):
    """The values are read only when the weights load (before the first evaluation): the
    run stops there, naming the file, the tensor and how many values are not finite."""
    model = tmp_path / "model"
    shutil.copytree(small_model_dir, model)

    def poison(t):
        bad = t[BIAS].copy()
        bad[[1, 4]] = np.nan
        return dict(t, **{BIAS: bad})

    file = _weights(model, poison)
    run_dir = tmp_path / "run"
    code, err = entr_run(["quickstart", "--run_dir", str(run_dir), "--model.path", str(model),
                          *QUICK])
    assert (code, err) == (2, f"entr-run: error: {file}: tensor '{BIAS}' has 2 NaN/inf values "
                              "of 16")
    assert not (run_dir / "eval").exists() and not (run_dir / "metrics.jsonl").exists()


GOOD = '{"question": "q", "answer": "<<2+3=5>> #### 5"}\n'
DATA_CASES = {
    "row without answer": (GOOD + '{"question": "q2"}\n', 2,
                           "field 'answer' is missing (each row needs question: str, answer: str)"),
    "answer of the wrong type": (GOOD + '{"question": "q2", "answer": ["5"]}\n', 2,
                                 "field 'answer' must be str, got list \"['5']\""),
    "row that is not an object": (
        GOOD + '["q", "a"]\n', 2,
        "a row must be a JSON object (question: str, answer: str), got list"),
    "binary file": (GOOD + "\x00\xff\xfe\n", 2, "not UTF-8 text ("),
}


@pytest.mark.parametrize("case", sorted(DATA_CASES))
def test_a_bad_data_file_is_refused_naming_file_and_line(case, data_dir, tmp_path, entr_run):
    text, line, problem = DATA_CASES[case]
    train = data_dir / "gsm8k" / "train.jsonl"
    train.write_bytes(text.encode("latin-1"))
    run_dir = tmp_path / "run"
    code, err = entr_run(["quickstart", "--run_dir", str(run_dir), *QUICK])
    assert code == 2
    assert err.startswith(f"entr-run: error: {train}:{line}: {problem}"), err
    assert not run_dir.exists()


def test_a_benchmark_row_without_a_final_answer_is_refused(data_dir, tmp_path, entr_run):
    (data_dir / "gsm8k" / "test.jsonl").write_text(
        GOOD + '{"question": "q2", "answer": "no final line"}\n')
    shutil.copy(tiny_dir().parents[0] / "data" / "gsm8k" / "train.jsonl.gz",
                data_dir / "gsm8k" / "train.jsonl.gz")
    code, err = entr_run(["quickstart", "--run_dir", str(tmp_path / "run"), "--task.name",
                          "gsm8k", "--task.max_total_tokens", "16", *QUICK])
    assert code == 2
    assert (f"entr-run: error: {data_dir}/gsm8k/test.jsonl:2: GSM8K solution has no '####' "
            "line: 'no final line'") in err


def test_a_data_folder_that_does_not_exist_is_refused(tmp_path, entr_run, monkeypatch):
    """A mistyped --data.dir used to fall back silently to the packaged data."""
    monkeypatch.delenv("ENTR_DATA_DIR", raising=False)
    missing = tmp_path / "no_such_folder"
    code, err = entr_run(["quickstart", "--run_dir", str(tmp_path / "run"), "--data.dir",
                          str(missing), *QUICK])
    assert (code, err) == (2, f"entr-run: error: the data folder {missing} (--data.dir) is not a "
                              "directory: fix the path, or leave out --data.dir to read the "
                              "packaged and cached files")
    monkeypatch.setenv("ENTR_DATA_DIR", str(missing))
    code, err = entr_run(["quickstart", "--run_dir", str(tmp_path / "run2"), *QUICK])
    assert code == 2 and f"{missing} (ENTR_DATA_DIR) is not a directory" in err
    assert "unset ENTR_DATA_DIR" in err


def test_a_data_file_found_nowhere_shows_its_fix_without_debug(tmp_path, entr_run, monkeypatch,
                                                              unpackaged):
    unpackaged("gsm8k/test.jsonl")
    monkeypatch.delenv("ENTR_DATA_DIR", raising=False)
    monkeypatch.setenv("ENTR_DATA_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("ENTR_DATA_OFFLINE", "1")
    code, err = entr_run(["quickstart", "--run_dir", str(tmp_path / "run"), "--task.name",
                          "gsm8k", "--task.max_total_tokens", "16", *QUICK])
    assert code == 2
    assert "entr-run: error: data file 'gsm8k/test.jsonl' (1319 rows, sha256 " in err
    assert ("was not found: run `entr-data fetch gsm8k` on a machine with internet (it fills "
            f"the user cache {tmp_path / 'cache'}), or pass --data.dir DIR / set "
            "ENTR_DATA_DIR=DIR to a folder holding gsm8k/test.jsonl.") in err
    assert "tried user cache" in err and "--debug" not in err


@pytest.mark.parametrize("name", ["metrics.jsonl", "config.json", "summary.json"])
def test_a_directory_where_the_run_writes_a_file_is_named(tmp_path, entr_run, name):
    """metrics.jsonl as a directory used to read as "already holds a run: pass --resume"."""
    run_dir = tmp_path / "run"
    (run_dir / name).mkdir(parents=True)
    for resume in ([], ["--resume"]):
        code, err = entr_run(["quickstart", "--run_dir", str(run_dir), *QUICK, *resume])
        assert (code, err) == (2, f"entr-run: error: run_dir {run_dir}: {run_dir / name} is a "
                                  f"directory, but the run writes its {name} file there; move "
                                  "it away or choose another --run_dir")
