"""Bad input is refused before any work, through the real CLI entry (`experiments.run.cli.main`):
exit status 2, one paragraph naming the field or the file, no traceback, nothing written."""

import dataclasses
import errno
import os
import re

import pytest

from experiments.run import cli


@pytest.fixture
def call(entr_run):
    """``call(argv, capsys)``: `entr_run` (conftest) with this module's signature."""
    return lambda argv, capsys: entr_run(argv)


# Parse-time refusals: (arguments, the message printed)
PARSE_CASES = [
    (["--task.samples_per_prompt", "1"],
     "task.samples_per_prompt must be >= 2 with advantages.estimator='grpo': the advantage is "
     "relative to the prompt's group, so a group of one gets advantage 0 and nothing is "
     "trained, got 1"),
    (["--token_samples_every", "-1"], "token_samples_every must be >= 0 (0 = never), got -1"),
    (["--task.max_total_tokens", "2"],
     "task.max_total_tokens must be >= task.max_new_tokens (12); the episode budget counts "
     "response tokens only, so a smaller one would silently cut every generation, got 2"),
    (["--sampling.top_p", "1.5"], "sampling.top_p must be in (0, 1], got 1.5"),
    (["--sampling.top_p", "0"], "sampling.top_p must be in (0, 1], got 0.0"),
    (["--sampling.min_p", "2"], "sampling.min_p must be in [0, 1), got 2.0"),
    (["--sampling.top_k", "0"], "sampling.top_k must be -1 (disabled) or >= 1, got 0"),
    (["--sampling.temperature", "0"], "sampling.temperature must be > 0, got 0.0"),
    (["--sampling.temperature", "-1"], "sampling.temperature must be > 0, got -1.0"),
    (["--sft.warmup_steps", "-5"], "sft.warmup_steps must be >= 0, got -5"),
    (["--sft.schedule", "cosine", "--sft.steps", "20", "--sft.warmup_steps", "20"],
     "sft.steps must be > sft.warmup_steps (20) with sft.schedule 'cosine', got 20"),
    (["--sampler.min_prompt_bucket", "0"], "sampler.min_prompt_bucket must be >= 1, got 0"),
    (["--learner.logprob_chunk", "0"], "learner.logprob_chunk must be >= 1, got 0"),
    (["--optim.warmup_steps", "-1"],
     "Error parsing optim: optim.warmup_steps must be >= 0, got -1"),
    (["--staleness.mode", "sync", "--staleness.inter_lag", "5"],
     "staleness.inter_lag only applies to staleness.mode=simulated; this run is "
     "staleness.mode=sync: it trains on-policy (lag 0, no intra switches). Remove "
     "--staleness.inter_lag or set --staleness.mode simulated"),
    (["--staleness.mode", "async", "--staleness.max_staleness", "1", "--staleness.inter_lag", "5"],
     "staleness.inter_lag only applies to staleness.mode=simulated; this run is "
     "staleness.mode=async: it measures staleness and bounds it with staleness.max_staleness "
     "(1)."),
    (["--staleness.mode", "sync", "--staleness.intra_switches=1"],
     "staleness.intra_switches only applies to staleness.mode=simulated; this run is "
     "staleness.mode=sync"),
    (["--staleness.max_staleness", "1"],
     "staleness.max_staleness only applies to staleness.mode=async; this run is "
     "staleness.mode=simulated"),
    (["--objective.name", "nope"], "nope"),
    (["--objective.name", "grpo", "--objective.grpo.kl_coef", "0.04", "--sampling.top_p", "0.9"],
     "--objective.grpo.kl_coef 0.04 (a k3 KL penalty to the reference policy) cannot be used "
     "with sampling filters (--sampling.top_p 0.9)"),
    (["--objective.name", "grpo", "--objective.grpo.kl_coef", "0.04", "--sampling.top_k", "5",
      "--sampling.min_p", "0.05"],
     "sampling filters (--sampling.top_k 5, --sampling.min_p 0.05): the reference is then scored "
     "under its filtered distribution"),
    # values that used to be refused only after SFT, evaluation and RL had started (or never)
    (["--staleness.seed", "-3"], "staleness.seed must be in [0, 2**32) (numpy's seeds), got -3"),
    (["--seed", "-1"], "seed must be in [0, 2**32), got -1"),
    (["--model.init_seed", "4294967296"], "model.init_seed must be in [0, 2**32), got 4294967296"),
    (["--staleness.max_inter_lag", "-1"], "staleness.max_inter_lag must be >= 0, got -1"),
    (["--sampling.temperature", "1e-30"],
     "sampling.temperature must be >= 0.01 (below it sampling is an argmax to float32 "
     "precision and the learner's gradient, which scales as 1/T, overflows; the evaluation's "
     "greedy pass is top-1 whatever T is), got 1e-30"),
    (["--optim.weight_decay", "nan"], "optim.weight_decay must be a finite number, got nan"),
    (["--optim.learning_rate", "inf"], "optim.learning_rate must be a finite number, got inf"),
    (["--sampling.temperature", "inf"], "sampling.temperature must be a finite number, got inf"),
    (["--sampler.logit_noise_std", "inf"],
     "sampler.logit_noise_std must be a finite number, got inf"),
    (["--objective.entr.tau", "nan"], "objective.entr.tau must be a number in (0.0, inf], got nan"),
    (["--name", ""], "name must be a non-empty run name inside runs/"),
    (["--name", "../elsewhere"], "name must be a non-empty run name inside runs/"),
    # found by benchmarks/bad_inputs.py: reached the work silently, or hung
    (["--rl_steps", str(10**30)],
     f"rl_steps must be a 64-bit integer (in [-2**63, 2**63)), got {10**30}"),
    (["--task.samples_per_prompt", str(10**30)],
     f"task.samples_per_prompt must be a 64-bit integer (in [-2**63, 2**63)), got {10**30}"),
    (["--sampler.kind", "sglang", "--sampler.server_urls", "127.0.0.1:30000", "",
      "--objective.entr.entropy_source", "behavior_topk", "--staleness.intra_switches", "0"],
     "sampler.server_urls must be http(s):// URLs (e.g. http://127.0.0.1:30000), got "
     "('127.0.0.1:30000', '')"),
    (["--optim.total_steps", "-1"],
     "Error parsing optim: optim.total_steps must be >= 0, got -1"),
    # options of a kind, objective or task the run does not select
    (["--sampler.server_urls", "http://127.0.0.1:30000"],
     "sampler.server_urls only applies to sampler.kind=sglang; this run is sampler.kind=jax. "
     "Remove --sampler.server_urls or set --sampler.kind sglang"),
    (["--sampler.fleet.max_attempts", "3"],
     "sampler.fleet.max_attempts only applies to sampler.kind=sglang"),
    (["--objective.name", "grpo", "--objective.entr.tau", "0.5"],
     "objective.entr.tau only applies to objective.name=entr/estr; this run is "
     "objective.name=grpo. Remove --objective.entr.tau or set --objective.name entr"),
    (["--sft.save_model", "maybe"],
     "sft.save_model is a switch and takes no value (got 'maybe'): write --sft.save_model to "
     "turn it on or --sft.no_save_model to turn it off"),
    (["--verifier.no_fast_path=false"],
     "verifier.fast_path is a switch and takes no value (got 'false'): write "
     "--verifier.fast_path to turn it on or --verifier.no_fast_path to turn it off"),
    (["--task.chain_terms_max", "12"],
     "task.chain_terms_max only applies to task.name=chain_sum; this run is task.name=arithmetic"),
    # the embedded sampler's options with the fleet (scan_layers was once let through)
    (["--sampler.kind", "sglang", "--sampler.server_urls", "http://127.0.0.1:30000",
      "--objective.entr.entropy_source", "behavior_topk", "--staleness.intra_switches", "0",
      "--sampler.scan_layers"],
     "sampler.scan_layers only applies to sampler.kind=jax; this run is sampler.kind=sglang. "
     "Remove --sampler.scan_layers or set --sampler.kind jax"),
]


def test_every_sampler_option_belongs_to_one_kind():
    """Each field of `SamplerSpec` but ``kind`` states the kind that reads it (at the
    field: `experiments.run.specs.variant`), so a new option cannot slip through for the
    other kind; the rules are read from the types, not kept by hand."""
    from experiments.run.config import SELECTED_FIELDS, SamplerSpec

    fields = [f.name for f in dataclasses.fields(SamplerSpec) if f.name != "kind"]
    rules = {k.rstrip(".").split(".", 1)[1]: v for k, v in SELECTED_FIELDS.items()
             if k.startswith("sampler.")}
    assert sorted(rules) == sorted(fields)
    assert {v[0] for v in rules.values()} == {"sampler.kind"}
    assert rules["scan_layers"] == ("sampler.kind", ("jax",))
    assert rules["fleet"] == ("sampler.kind", ("sglang",))


@pytest.mark.parametrize("args, message", PARSE_CASES, ids=[" ".join(a) for a, _ in PARSE_CASES])
def test_bad_fields_are_refused_at_parse_time_naming_the_field(call, args, message, capsys,
                                                               tmp_path):
    run_dir = tmp_path / "run"
    code, err = call(["quickstart", "--run_dir", str(run_dir), *args], capsys)
    assert code == 2
    assert message in err
    assert "Traceback" not in err
    assert not run_dir.exists()


def test_objective_name_lists_the_registry_names_in_help_and_errors(call, capsys):
    code, err = call(["quickstart", "--objective.name", "nope"], capsys)
    assert code == 2
    for name in ("cispo", "entr", "estr", "grpo", "icepop", "kpop", "sat", "vespo"):
        assert f"'{name}'" in err
    with pytest.raises(SystemExit) as exc:
        cli.main(["quickstart", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "type: ignore" not in out
    assert "--objective.name {cispo,decoupled_ppo,entr,estr,grpo,gspo,icepop,kpop,m2po," in out
    assert "selects the method" in out


def test_a_preset_value_the_mode_does_not_read_is_noted_not_refused(capsys):
    cfg, opts = cli.parse(["quickstart", "--staleness.mode", "async"])
    assert cfg.staleness.mode == "async" and not opts.resume
    err = capsys.readouterr().err
    assert err.strip() == ("entr-run: note: staleness.mode=async does not read the preset's "
                           "staleness inter_lag=2, intra_switches=1, switch_window=4 (they "
                           "apply to other modes)")


def test_resume_override_needs_resume(call, capsys):
    code, err = call(["quickstart", "--resume-override"], capsys)
    assert (code, err) == (2, "entr-run: error: --resume-override only makes sense with --resume")


def test_gpu_presets_need_a_model_path(call, capsys):
    code, err = call(["math"], capsys)
    assert (code, err) == (2, "entr-run: error: preset 'math' needs model.path (--model.path "
                              "DIR, a local Hugging Face checkpoint directory)")


def test_unknown_preset(call, capsys):
    code, err = call(["quickstrat"], capsys)
    assert code == 2
    assert err == ("entr-run: error: the first argument must be a preset (gsm8k_tools, math, "
                   "quickstart, stress), got 'quickstrat'")


# Refusals when the job is built (devices, files), still before any work.

def test_mesh_larger_than_the_devices(call, capsys, tmp_path):
    run_dir = tmp_path / "run"
    code, err = call(["quickstart", "--run_dir", str(run_dir), "--learner.mesh.data", "16"], capsys)
    assert code == 2
    assert err == ("entr-run: error: learner.mesh (data=16, fsdp=1, tensor=1) does not tile the "
                   "8 cpu device(s) available: data x fsdp x tensor must equal the device "
                   "count (-1 takes what is left)")
    assert not run_dir.exists()


def test_sampler_replicas_beyond_the_local_devices(call, capsys, tmp_path):
    run_dir = tmp_path / "run"
    code, err = call(["quickstart", "--run_dir", str(run_dir), "--sampler.num_devices", "9"],
                     capsys)
    assert code == 2
    assert err == ("entr-run: error: sampler.num_devices=9 but this process has 8 local cpu "
                   "device(s) (on CPU, start the process with XLA_FLAGS=--xla_force_host_"
                   "platform_device_count=9); -1 takes them all")
    assert not run_dir.exists()


def test_model_config_that_is_not_json_names_the_file(call, capsys, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"architectures": ["Qwen2ForCausalLM"],\n  oops}')
    run_dir = tmp_path / "run"
    code, err = call(["quickstart", "--run_dir", str(run_dir), "--model.path", str(model)], capsys)
    assert code == 2
    assert err == (f"entr-run: error: {model}/config.json: not valid JSON (line 2, column 3: "
                   "Expecting property name enclosed in double quotes)")
    assert not run_dir.exists()


def test_model_path_without_config_json(call, capsys, tmp_path):
    code, err = call(["quickstart", "--run_dir", str(tmp_path / "run"), "--model.path",
                      str(tmp_path)], capsys)
    assert (code, err) == (2, f"entr-run: error: model.path {str(tmp_path)!r} has no config.json")


def test_malformed_jsonl_line_names_file_and_line(call, capsys, tmp_path, data_dir):
    train = data_dir / "gsm8k" / "train.jsonl"
    train.write_text('{"question": "q", "answer": "<<2+3=5>> #### 5"}\n{"question": "q2", "answer":\n')
    run_dir = tmp_path / "run"
    code, err = call(["quickstart", "--run_dir", str(run_dir)], capsys)
    assert code == 2
    assert err.startswith(f"entr-run: error: {train}:2: invalid JSON (Expecting value: line 2 "
                          "column 1 (char 29))")
    assert "Traceback" not in err
    assert not run_dir.exists()


def test_empty_training_file_names_the_file(call, capsys, tmp_path, data_dir):
    train = data_dir / "gsm8k" / "train.jsonl"
    train.write_text("")
    run_dir = tmp_path / "run"
    code, err = call(["quickstart", "--run_dir", str(run_dir)], capsys)
    assert code == 2
    assert err == f"entr-run: error: {train}: holds no examples (the file is empty)"
    assert not run_dir.exists()


def test_too_few_training_examples_name_the_field(call, capsys, tmp_path, data_dir):
    (data_dir / "gsm8k" / "train.jsonl").write_text(
        '{"question": "q", "answer": "<<2+3=5>> <<2*8=16>> #### 16"}\n')
    run_dir = tmp_path / "run"
    code, err = call(["quickstart", "--run_dir", str(run_dir)], capsys)
    assert code == 2
    # by the sha256 split "2+3" is a training expression and "2*8" an evaluation one
    assert err == (f"entr-run: error: task.name='arithmetic' has 1 training examples, fewer "
                   f"than task.prompts_per_step (16); data read from {data_dir} (check "
                   "task.arithmetic_max_chars / task.arithmetic_ops)")
    assert not run_dir.exists()


@pytest.mark.parametrize("field", ["shared_eval_dir", "logging.wandb_dir"])
def test_an_output_folder_that_is_a_file_is_refused(field, call, capsys, tmp_path):
    """Found by benchmarks/bad_inputs.py: the run used to start and fail at its first
    write there."""
    file = tmp_path / "a_file"
    file.write_text("x")
    code, err = call(["quickstart", "--run_dir", str(tmp_path / "run"), f"--{field}",
                      str(file)], capsys)
    assert (code, err) == (2, f"entr-run: error: {field} {file}: exists and is not a "
                              f"directory; choose another --{field}")
    assert not (tmp_path / "run").exists()


def test_path_component_over_name_max(call, capsys, tmp_path):
    run_dir = tmp_path / ("a" * 300) / "run"
    code, err = call(["quickstart", "--run_dir", str(run_dir)], capsys)
    assert code == 2
    assert ("the path component 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa...' is 300 bytes, over "
            "the file system's limit of 255 bytes (NAME_MAX); choose a shorter --run_dir") in err
    assert list(tmp_path.iterdir()) == []


def test_read_only_run_dir_simulated(call, capsys, tmp_path, monkeypatch):
    """A directory where files cannot be created (simulated: tests may run as root)."""
    from experiments.run import preflight

    def refuse(*args, dir=None, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", os.path.join(dir, "probe"))

    monkeypatch.setattr(preflight.tempfile, "mkstemp", refuse)
    code, err = call(["quickstart", "--run_dir", str(tmp_path / "ro" / "run")], capsys)
    assert code == 2
    assert err == (f"entr-run: error: run_dir {tmp_path}/ro/run: cannot create files in "
                   f"{tmp_path} (Permission denied); choose a writable --run_dir")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_read_only_run_dir(call, capsys, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        code, err = call(["quickstart", "--run_dir", str(ro / "run")], capsys)
    finally:
        ro.chmod(0o755)
    assert code == 2 and f"cannot create files in {ro} (Permission denied)" in err


def test_full_disk_when_writing_the_run_directory(call, capsys, tmp_path, monkeypatch):
    """ENOSPC while config.json is written: one line naming the file, nothing partial."""
    from experiments.run import rundir

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(rundir.os, "fsync", full)
    run_dir = tmp_path / "run"
    code, err = call(["quickstart", "--run_dir", str(run_dir), "--task.eval_examples", "2"], capsys)
    assert code == 2
    assert err == (f"entr-run: error: the disk is full: writing {run_dir}/config.json failed (No "
                   "space left on device). Free space on that disk, then run again: entr-run "
                   f"quickstart --run_dir {run_dir} --task.eval_examples 2. Traceback: "
                   f"{run_dir}/logs/error.log.")
    assert sorted(p.name for p in run_dir.iterdir()) == ["logs"]  # no config.json(.tmp)
    assert "OSError: [Errno 28]" in (run_dir / "logs" / "error.log").read_text()


def test_full_disk_mid_run_names_the_file_and_the_resume_command(call, capsys, tmp_path,
                                                                  monkeypatch):
    """A disk that filled while safetensors wrote the weights used to end with
    "SafetensorError; a bug?", exit 1, no file named."""
    import numpy as np
    from safetensors import SafetensorError

    from entr_jax.model import hf_io
    from experiments.run.job import Job

    def full(tensors, filename, metadata=None):
        raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: '
                              'StorageFull, message: "No space left on device" })')

    run_dir = tmp_path / "run"
    weights = run_dir / "sft_model" / "model.safetensors"

    def run_job(self):  # the run has started (config.json), then saves its weights
        run_dir.mkdir()
        (run_dir / "config.json").write_text(self.cfg.to_json())
        hf_io.save_safetensors({"w": np.zeros(2, np.float32)}, str(weights))

    monkeypatch.setattr(hf_io, "save_file", full)
    monkeypatch.setattr(Job, "run_job", run_job)
    argv = ["quickstart", "--run_dir", str(run_dir), "--task.eval_examples", "2"]
    code, err = call(argv, capsys)
    assert (code, err) == (2, (
        f"entr-run: error: the disk is full: writing {weights} failed (No space left on "
        "device). Free space on that disk, then resume with: entr-run quickstart --run_dir "
        f"{run_dir} --task.eval_examples 2 --resume. Traceback: {run_dir}/logs/error.log."))
    with pytest.raises(OSError) as e:  # the library names the file and keeps the cause
        hf_io.save_safetensors({"w": np.zeros(2, np.float32)}, str(weights))
    assert (e.value.errno, e.value.filename) == (errno.ENOSPC, str(weights))
    assert isinstance(e.value.__cause__, SafetensorError)


@pytest.mark.parametrize("how", ["flag", "env"])
def test_debug_flag_prints_the_traceback(how, capsys, tmp_path, monkeypatch):
    from experiments.run import rundir

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(rundir.os, "fsync", full)
    argv = ["quickstart", "--run_dir", str(tmp_path / "run"), "--task.eval_examples", "2"]
    if how == "env":
        monkeypatch.setenv("ENTR_DEBUG", "1")
    else:
        argv.append("--debug")
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err
    assert err.rstrip().splitlines()[-1].startswith("entr-run: error: the disk is full: writing ")


def test_cli_subprocess_exit_status_and_one_paragraph(tmp_path):
    """The console entry point as a user runs it: status 2, one line, no traceback."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "experiments.run", "quickstart", "--run_dir",
                           str(tmp_path / "run"), "--learner.mesh.fsdp", "3"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines == ["entr-run: error: learner.mesh (data=-1, fsdp=3, tensor=1) does not tile "
                     "the 8 cpu device(s) available: data x fsdp x tensor must equal the "
                     "device count (-1 takes what is left)"]


def test_the_readme_quickstart_commands_parse(capsys):
    """Every `entr-run quickstart ...` example in README.md is accepted (the staleness
    checks must not refuse documented commands)."""
    import pathlib
    import shlex

    readme = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
    lines = [ln.split("#")[0] for ln in readme.splitlines() if ln.startswith("entr-run quickstart ")]
    assert len(lines) >= 4
    for line in lines:
        argv = [a for a in shlex.split(line)[1:] if a != "--help"]
        cfg, opts = cli.parse(argv)
        assert cfg.name == "quickstart", line


def test_prompt_plus_response_budget_over_the_model_context(call, capsys, tmp_path):
    """Checked against the task's prompts as soon as the task is built (before any
    evaluation or compilation): the embedded tiny model has a 512-token context."""
    run_dir = tmp_path / "run"
    code, err = call(["quickstart", "--run_dir", str(run_dir), "--task.max_new_tokens", "509",
                      "--task.max_total_tokens", "509"], capsys)
    assert code == 2
    assert re.fullmatch(
        r"entr-run: error: task\.max_total_tokens \(509\) plus the longest train prompt \(\d+ "
        r"tokens, example 'gsm8k_arith/[^']+'\) exceeds the model's context "
        r"\(max_position_embeddings 512\)", err), err
    assert not run_dir.exists()
    n = int(re.search(r"train prompt \((\d+) tokens", err).group(1))
    # the boundary: prompt + budget == context fits, one more token does not
    import dataclasses

    from entr_jax.assets import tiny_dir
    from entr_jax.tokenizer import Tokenizer
    from experiments.run import preflight
    from experiments.run.configs import QUICKSTART
    from experiments.run.errors import ConfigError
    from experiments.run.tasks import build_task

    task = build_task(QUICKSTART.task)
    tok = Tokenizer.from_pretrained(str(tiny_dir()))
    model = preflight.read_model_config(tiny_dir())
    for budget, ok in ((512 - n, True), (513 - n, False)):
        cfg = dataclasses.replace(QUICKSTART, task=dataclasses.replace(
            QUICKSTART.task, max_new_tokens=budget, max_total_tokens=budget))
        if ok:
            preflight.check_task(cfg, task, tok, model, max_prompt_len=4096)
        else:
            with pytest.raises(ConfigError, match=f"plus the longest train prompt \\({n} tokens"):
                preflight.check_task(cfg, task, tok, model, max_prompt_len=4096)


def test_resume_reads_the_runs_own_configuration(call, tmp_path, capsys):
    """``--resume`` with only ``--run_dir`` rebuilds the saved configuration (no need to
    retype the run's overrides); a flag given with it changes just that field; a saved
    field this version does not know is named."""
    import dataclasses
    import json

    from experiments.run.configs import QUICKSTART

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    started = dataclasses.replace(
        QUICKSTART, run_dir=str(run_dir), rl_steps=6,
        sft=dataclasses.replace(QUICKSTART.sft, steps=5),
        task=dataclasses.replace(QUICKSTART.task, eval_examples=4, eval_samples=2))
    (run_dir / "config.json").write_text(started.to_json())
    cfg, opts = cli.parse(["quickstart", "--run_dir", str(run_dir), "--resume"])
    assert opts.resume and cfg == started
    assert (cfg.rl_steps, cfg.sft.steps, cfg.task.eval_examples) == (6, 5, 4)
    cfg, _ = cli.parse(["quickstart", "--run_dir", str(run_dir), "--resume", "--rl_steps", "9"])
    assert cfg == dataclasses.replace(started, rl_steps=9)
    # without --resume the preset is the base, whatever the directory holds
    cfg, _ = cli.parse(["quickstart", "--run_dir", str(run_dir)])
    assert (cfg.rl_steps, cfg.sft.steps) == (QUICKSTART.rl_steps, QUICKSTART.sft.steps)
    saved = json.loads(started.to_json())
    saved["task"]["gone_field"] = 1
    (run_dir / "config.json").write_text(json.dumps(saved))
    code, err = call(["quickstart", "--run_dir", str(run_dir), "--resume"], capsys)
    assert code == 2
    assert ("cannot resume from " + str(run_dir / "config.json") + ": the saved config.json "
            "has field(s) this version does not know: task.gone_field") in err


def test_missing_warm_start_says_how_to_make_it(call, capsys, tmp_path):
    missing = tmp_path / "runs" / "sft_base" / "sft_model"
    code, err = call(["quickstart", "--run_dir", str(tmp_path / "run"), "--model.path",
                      str(missing)], capsys)
    assert code == 2
    assert err == (f"entr-run: error: model.path {str(missing)!r} is not a directory (a local "
                   "Hugging Face checkpoint: config.json, safetensors, tokenizer files); it is "
                   "the warm start a run exports: make it with `entr-run PRESET --run_dir "
                   f"{missing.parent} --rl_steps 0` (the CPU sweeps read runs/sft_base from "
                   "quickstart, the two-methods recipe runs/quickstart, which `entr-run "
                   "quickstart` writes; the stress sweeps read runs/stress_sft3500, made by the two "
                   "commands at the top of experiments/sweeps/stress_regime.toml)")


def test_a_run_too_short_for_its_lag_is_warned_with_the_full_lag_step_count(tmp_path):
    """Simulated inter lag 30 + 3 switches over 40 steps: the delay line fills first, so
    only steps 33..39 get the configured lag; the job warns (and still runs)."""
    import dataclasses

    from experiments.run import preflight
    from experiments.run.configs import QUICKSTART, STRESS

    assert preflight.lag_horizon(QUICKSTART) is None  # inter 2 + 1 over 100 steps
    assert preflight.lag_horizon(STRESS) is None  # inter 4 + 3 over 60 steps
    long_lag = dataclasses.replace(STRESS, rl_steps=40, staleness=dataclasses.replace(
        STRESS.staleness, inter_lag=30, intra_switches=3))
    assert preflight.lag_horizon(long_lag) == (
        "only 7 of rl_steps=40 steps get the configured lag in full (staleness.inter_lag 30 "
        "+ staleness.intra_switches 3): the delay line fills first, and 31 steps train on samples of "
        "the starting weights (version 0); raise rl_steps (or lower the lag) to measure the "
        "lag itself")  # steps 0..30 are made at version max(0, n - 30) = 0
    assert preflight.lag_horizon(dataclasses.replace(long_lag, rl_steps=66)) is None  # 33 of 66
    assert "only 32 of rl_steps=65" in preflight.lag_horizon(dataclasses.replace(long_lag, rl_steps=65))
    sync = dataclasses.replace(long_lag, staleness=dataclasses.replace(long_lag.staleness, mode="sync"))
    assert preflight.lag_horizon(sync) is None
    missing = tmp_path / "no_model"
    with pytest.warns(UserWarning, match="only 7 of rl_steps=40"):
        code = cli.main(["stress", "--run_dir", str(tmp_path / "run"), "--rl_steps", "40",
                         "--staleness.inter_lag", "30", "--staleness.intra_switches", "3",
                         "--model.path", str(missing)])
    assert code == 2  # refused afterwards for the missing model, before any work


def test_every_field_has_a_help_description():
    """``entr-run PRESET --help`` describes every field (tyro reads one ``name: text``
    entry per field from the class docstrings; ``a, b: text`` entries give none)."""
    import warnings

    import tyro

    from experiments.run.config import RunConfig
    from experiments.run.configs import PRESETS

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        parser = tyro.extras.get_parser(RunConfig, default=PRESETS["stress"][1])
    options = [a for a in parser._actions if a.option_strings and a.dest != "help"]
    bare = [a.option_strings[0] for a in options
            if not re.sub(r"\(default[^)]*\)\s*$", "", str(a.help or "")).strip()]
    assert len(options) > 150 and bare == []


def test_errors_of_a_section_name_the_field_as_the_command_line_does():
    """A section built from a library class (the optimizer, every objective's section)
    names its fields as the command line spells them, not as the class does."""
    from experiments.run.config import ObjectiveSpec, OptimSection, RunConfig

    with pytest.raises(ValueError) as err:
        OptimSection(learning_rate=0.0)
    assert str(err.value) == "optim.learning_rate must be > 0, got 0.0"
    for f in dataclasses.fields(ObjectiveSpec):
        if f.name == "name":
            continue
        section = f.type if isinstance(f.type, type) else type(f.default)
        assert section.__name__.endswith("Config")
        with pytest.raises(ValueError) as err:
            section(aggregation="nope")
        assert str(err.value).startswith(f"objective.{f.name}.aggregation "), str(err.value)
    cfg = RunConfig()
    assert type(cfg.optim) is OptimSection
