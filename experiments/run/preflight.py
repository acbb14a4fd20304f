"""Checks that refuse a run before any work (no evaluation, SFT, compilation or file of
the run is made first), each raising one error that names the field or the file.

* `check_run_dir`: every path component within the file system's ``NAME_MAX``; the
  directory (or its nearest existing parent) is writable.
* `check_output_dirs`: the folders a run writes outside its run directory are not files.
* `check_devices`: the learner mesh tiles the devices of this process group; the sampler's
  replicas fit its local devices.
* `read_model_config`: ``config.json`` of the model directory exists, is JSON and is a
  supported architecture, and the weights' headers match it (the message names the file).
* `check_tokenizer`: the tokenizer's ids all have a row in the model's embedding.
* `check_task`: enough training examples for a batch, non-empty evaluation sets, and the
  task's longest prompts plus the response budget fit the model's context.
* `lag_horizon`: a warning (not a refusal) when fewer than half of a simulated-staleness
  run's RL steps get the configured lag in full.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import tempfile
from typing import Any

from entr_jax import staleness
from entr_jax.assets import tiny_dir
from entr_jax.data import encode_prompt
from entr_jax.data.files import cache_dir, data_folder
from entr_jax.file_errors import BadFileError
from entr_jax.model import ModelConfig, check_hf_tensors, read_config
from experiments.run.config import RunConfig, dotted
from experiments.run.errors import ConfigError

__all__ = ["check_devices", "check_output_dirs", "check_run_dir", "check_task", "check_tokenizer", "lag_horizon",
           "read_model_config"]

# prompts tokenized per set by check_task: the longest by characters (tokenizing every
# GSM8K prompt through a chat template takes seconds; token counts follow the length)
LONGEST_PROMPTS_CHECKED = 256


def _name_max(existing: pathlib.Path) -> int:
    try:
        return os.pathconf(existing, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        return 255


def _exists(path: pathlib.Path) -> bool:
    try:
        return path.exists()
    except OSError:  # ENAMETOOLONG and the like: it cannot exist
        return False


def _nearest_existing(path: pathlib.Path) -> pathlib.Path:
    path = path.absolute()
    while not _exists(path) and path != path.parent:
        path = path.parent
    return path


# Directories a run creates inside its run directory (`experiments.run.rundir`).
RUN_SUBDIRS = ("checkpoints", "sft_checkpoints", "ring", "eval", "tb", "logs", "token_samples",
               "sft_model", "exports")
# Files a run writes inside its run directory (`experiments.run.rundir`).
RUN_FILES = ("config.json", "meta.json", "metrics.jsonl", "timing.jsonl", "sft.jsonl",
             "summary.json", "wandb.json", "resume_overrides.jsonl")


def check_run_dir(path: str | os.PathLike, field: str = "run_dir") -> None:
    """Refuse a run directory that cannot be created or written, before anything is made.

    Raises:
      ConfigError: a component longer than ``NAME_MAX`` bytes (named, with the limit); a
        path that exists and is not a directory, or holds a file where the run keeps a
        directory (`RUN_SUBDIRS`) or a directory where it writes a file (`RUN_FILES`), named
        (checked before "already holds a run", which a directory there would look like); a
        directory (or nearest existing parent)
        where a file cannot be created (read-only, permissions), with the OS reason.
    """
    path = pathlib.Path(path)
    existing = _nearest_existing(path)
    limit = _name_max(existing)
    for part in path.parts:
        size = len(os.fsencode(part))
        if size > limit:
            short = part if len(part) <= 40 else part[:37] + "..."
            raise ConfigError(
                f"{field} {str(path)[:80]!r}: the path component {short!r} is {size} bytes, "
                f"over the file system's limit of {limit} bytes (NAME_MAX); choose a shorter "
                f"--{field}")
    if existing.exists() and not existing.is_dir():
        raise ConfigError(f"{field} {path}: {existing} exists and is not a directory")
    for sub in RUN_SUBDIRS:  # orbax would fail in a thread at the first save, then hang
        if (path / sub).exists() and not (path / sub).is_dir():
            raise ConfigError(f"{field} {path}: {path / sub} exists and is not a directory "
                              f"(the run keeps its {sub} there); move it away or choose "
                              f"another --{field}")
    for name in RUN_FILES:  # e.g. metrics.jsonl/ used to read as "already holds a run"
        if (path / name).is_dir():
            raise ConfigError(f"{field} {path}: {path / name} is a directory, but the run "
                              f"writes its {name} file there; move it away or choose another "
                              f"--{field}")
    try:
        fd, probe = tempfile.mkstemp(prefix=".entr-write-check-", dir=existing)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise ConfigError(f"{field} {path}: cannot create files in {existing} ({reason}); "
                          "choose a writable --run_dir") from None


# Folders a run writes outside its run directory (dotted fields; empty = not used).
OUTPUT_DIR_FIELDS = ("shared_eval_dir", "sampler.export_dir", "logging.wandb_dir")


def check_output_dirs(cfg: RunConfig) -> None:
    """Refuse an output folder (`OUTPUT_DIR_FIELDS`) that exists and is not a directory:
    the run would fail at its first write there, after the work before it.

    Raises:
      ConfigError: naming the field and the path.
    """
    for field in OUTPUT_DIR_FIELDS:
        path = dotted(cfg, field)
        if path and _exists(pathlib.Path(path)) and not pathlib.Path(path).is_dir():
            raise ConfigError(f"{field} {path}: exists and is not a directory; choose "
                              f"another --{field}")


def check_devices(cfg: RunConfig) -> None:
    """The mesh ``learner.mesh`` must tile ``jax.device_count()`` devices, and the embedded
    sampler's ``sampler.num_devices`` replicas must fit this process's local devices.

    Raises:
      ConfigError: naming ``learner.mesh`` or ``sampler.num_devices``, the value and the
        device count.
    """
    import jax

    local = jax.local_devices()
    if cfg.sampler.kind == "jax" and cfg.sampler.num_devices > len(local):
        hint = (" (on CPU, start the process with XLA_FLAGS=--xla_force_host_platform_device_"
                f"count={cfg.sampler.num_devices})" if local[0].platform == "cpu" else "")
        raise ConfigError(
            f"sampler.num_devices={cfg.sampler.num_devices} but this process has "
            f"{len(local)} local {local[0].platform} device(s){hint}; -1 takes them all")

    mesh = cfg.learner.mesh
    n = jax.device_count()
    try:
        mesh.resolve(n)
    except ValueError:
        raise ConfigError(
            f"learner.mesh (data={mesh.data}, fsdp={mesh.fsdp}, tensor={mesh.tensor}) does "
            f"not tile the {n} {jax.devices()[0].platform} device(s) available: "
            "data x fsdp x tensor must equal the device count (-1 takes what is left)"
        ) from None


def lag_horizon(cfg: RunConfig) -> str | None:
    """The warning for a simulated-staleness run too short for its lag, or None.

    The delay line fills during the first ``inter_lag + intra_switches`` steps: step ``n``
    trains on samples no older than version 0, so the first ``inter_lag + 1`` steps (a
    fixed lag) all train on the starting weights' samples (`entr_jax.staleness.planned_lag`). When fewer than
    half of the ``rl_steps`` get the configured lag in full, the run mostly measures that
    start, not the lag, and the message says how many steps do."""
    st = cfg.staleness
    if st.mode != "simulated" or cfg.rl_steps <= 0:
        return None
    full = staleness.full_lag_steps(st, cfg.rl_steps)
    if 2 * full >= cfg.rl_steps:
        return None
    lag = (f"inter_lag {st.inter_lag}" if st.inter_distribution == "fixed"
           else f"inter_lag {st.inter_lag}..max_inter_lag {st.max_inter_lag}")
    # only steps n <= k_n, so n <= the largest lag, are made by the starting weights
    start = sum(staleness.generation_version(st, n) == 0
                for n in range(min(cfg.rl_steps, st.max_lag + 1)))
    return (f"only {full} of rl_steps={cfg.rl_steps} steps get the configured lag in full "
            f"(staleness.{lag} + staleness.intra_switches {st.intra_switches}): the delay line fills "
            f"first, and {start} steps train on samples of the starting weights (version 0); "
            "raise rl_steps (or lower the lag) to measure the lag itself")


def read_model_config(model_dir: str | os.PathLike) -> ModelConfig:
    """`ModelConfig` of ``<model_dir>/config.json``; a directory other than the embedded
    tiny default must also hold weights that match it (checked from the safetensors
    headers, no weight is read: `entr_jax.model.hf_io.check_hf_tensors`).

    Raises:
      ConfigError: the directory or its config.json is missing.
      entr_jax.file_errors.BadFileError: config.json is not JSON (with the line and
        column) or not a supported model; the weights are missing, or a tensor is missing,
        left over, of another shape or of a non-float dtype; every message names the file.
    """
    file = pathlib.Path(model_dir) / "config.json"
    if not pathlib.Path(model_dir).is_dir():
        hint = ""
        if pathlib.Path(model_dir).name == "sft_model":  # a run's exported warm start
            run = pathlib.Path(model_dir).parent
            hint = (f"; it is the warm start a run exports: make it with `entr-run PRESET "
                    f"--run_dir {run} --rl_steps 0` (the CPU sweeps read runs/sft_base from "
                    "quickstart, the two-methods recipe runs/quickstart, which `entr-run "
                    "quickstart` writes; the stress sweeps read runs/stress_sft3500, made by the two "
                    "commands at the top of experiments/sweeps/stress_regime.toml)")
        raise ConfigError(f"model.path {str(model_dir)!r} is not a directory (a local Hugging "
                          f"Face checkpoint: config.json, safetensors, tokenizer files){hint}")
    if not file.is_file():
        raise ConfigError(f"model.path {str(model_dir)!r} has no config.json")
    config = read_config(model_dir)
    if pathlib.Path(model_dir).resolve() != pathlib.Path(tiny_dir()).resolve():
        try:
            check_hf_tensors(str(model_dir), config)
        except FileNotFoundError as e:
            raise ConfigError(f"model.path {str(model_dir)!r}: {e}") from None
    return config


def check_tokenizer(tokenizer: Any, model_cfg: ModelConfig, model_dir: str | os.PathLike) -> None:
    """The tokenizer must be the model's: every id it can produce (and every end-of-sequence
    id) has a row in the model's embedding.

    Raises:
      entr_jax.file_errors.BadFileError: naming tokenizer.json (or generation_config.json),
        the sizes and config.json.
    """
    where = pathlib.Path(model_dir)
    vocab = model_cfg.vocab_size
    if tokenizer.vocab_size > vocab:
        raise BadFileError(where / "tokenizer.json", (
            f"{tokenizer.vocab_size} tokens, but config.json's vocab_size is {vocab}: ids "
            f">= {vocab} would have no embedding row (the tokenizer of another model?)"))
    bad = [i for i in tokenizer.eos_token_ids if i >= vocab]
    if bad:
        raise BadFileError(where / "generation_config.json", (
            f"end-of-sequence ids {bad} are not below config.json's vocab_size {vocab}"))


def _longest_prompts(examples: list[dict], env_factory, tokenizer) -> tuple[int, Any]:
    """(tokens, example id) of the longest prompt among the `LONGEST_PROMPTS_CHECKED`
    longest questions."""
    ranked = sorted(examples, key=lambda e: len(str(e.get("question", ""))), reverse=True)
    env = env_factory()
    best = (0, None)
    for ex in ranked[:LONGEST_PROMPTS_CHECKED]:
        n = len(encode_prompt(tokenizer, env.reset(ex)))
        if n > best[0]:
            best = (n, ex.get("id"))
    return best


def _data_source(cfg: RunConfig) -> str:
    """Where the task's data files are looked up first (for error messages)."""
    folder = data_folder(cfg.data.dir)
    if folder is not None:
        return str(folder)
    return f"the package or the user cache {cache_dir()} (no --data.dir / ENTR_DATA_DIR)"


def check_task(cfg: RunConfig, task: Any, tokenizer: Any, model_cfg: ModelConfig,
               max_prompt_len: int | None = None) -> None:
    """Refuse a task that cannot train or evaluate, right after it is built.

    Args:
      task: the `experiments.run.tasks.TaskBundle`.
      model_cfg: the policy's config (``max_position_embeddings``).
      max_prompt_len: the embedded sampler's longest accepted prompt (None: no limit).

    Raises:
      entr_jax.file_errors.BadFileError: the tokenizer is not the model's (`check_tokenizer`).
      ConfigError: fewer training examples than ``task.prompts_per_step`` (naming the data
        folder), an empty evaluation set, ``sft.steps > 0`` without demonstrations, or a prompt that with ``task.max_total_tokens``
        response tokens exceeds the model's context or the sampler's prompt limit (naming
        the example id and the numbers).
    """
    spec = cfg.task
    check_tokenizer(tokenizer, model_cfg, cfg.model.path or tiny_dir())
    if len(task.train) < spec.prompts_per_step:
        raise ConfigError(
            f"task.name={spec.name!r} has {len(task.train)} training examples, fewer than "
            f"task.prompts_per_step ({spec.prompts_per_step}); data read from {_data_source(cfg)}"
            + (" (check task.arithmetic_max_chars / task.arithmetic_ops)"
               if spec.name == "arithmetic" else ""))
    for name, examples in task.eval_sets.items():
        if not examples:
            raise ConfigError(f"task.name={spec.name!r}: evaluation set {name!r} is empty "
                              f"(data read from {_data_source(cfg)})")
    if cfg.sft.steps > 0 and not task.demos:
        raise ConfigError(f"sft.steps is {cfg.sft.steps} but task.name={spec.name!r} has no "
                          "demonstrations for a supervised warm start: set --sft.steps 0")
    sets = {"train": task.train, **task.eval_sets}
    for name, examples in sets.items():
        tokens, example_id = _longest_prompts(examples, task.env_factory, tokenizer)
        context = model_cfg.max_position_embeddings
        if tokens + spec.max_total_tokens > context:
            raise ConfigError(
                f"task.max_total_tokens ({spec.max_total_tokens}) plus the longest {name} "
                f"prompt ({tokens} tokens, example {example_id!r}) exceeds the model's "
                f"context (max_position_embeddings {context})")
        if max_prompt_len is not None:
            # later turns send the prompt plus the episode so far as the next prompt
            longest_context = tokens + (spec.max_total_tokens if spec.max_turns > 1 else 0)
            if longest_context > max_prompt_len:
                raise ConfigError(
                    f"the longest {name} prompt ({tokens} tokens, example {example_id!r})"
                    + (f" plus task.max_total_tokens ({spec.max_total_tokens}) over "
                       f"{spec.max_turns} turns" if spec.max_turns > 1 else "")
                    + f" exceeds the embedded sampler's max_prompt_len ({max_prompt_len})")


def weights_sha256(model_dir: str | os.PathLike) -> str:
    """sha256 (hex) of a checkpoint's weights: its ``*.safetensors`` files hashed one after
    the other in name order (for one file, ``sha256sum model.safetensors``)."""
    files = sorted(pathlib.Path(model_dir).glob("*.safetensors"))
    if not files:
        raise ConfigError(f"model.path {str(model_dir)!r} has no *.safetensors weights to hash")
    digest = hashlib.sha256()
    for f in files:
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def check_weights_sha256(cfg: Any) -> None:
    """Refuse weights other than the ones ``model.sha256`` names (before any work).

    Raises:
      ConfigError: naming the directory, the expected and the found digest.
    """
    if not cfg.model.sha256:
        return
    found = weights_sha256(cfg.model.path)
    if found != cfg.model.sha256:
        raise ConfigError(
            f"model.path {cfg.model.path!r} holds other weights than model.sha256 names "
            f"(expected {cfg.model.sha256}, found {found}): the experiment is frozen to one "
            "warm start; point model.path at it, or change model.sha256 in the spec")
