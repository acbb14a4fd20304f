"""Bad inputs tried on ``entr-run``, by kind, without training: a reliability tally.

Usage::

    python -m benchmarks.bad_inputs --out bad_inputs.json [--kinds config cli ...]
                                    [--fields task. sampling.top_p ...]

Every case of `benchmarks.bad_input_cases` runs in this process through
`experiments.run.cli.main` (the command line a user runs), each in its own folder, with the
run's first real work replaced by a private sentinel: the learner's checkpoint manager
(`experiments.run.build.build`) is built after every refusal (run directory, resume
policy, devices, model and tokenizer files, task data, the weights' values, the learner's
config), so a case that gets there has "reached the work" and nothing is trained. Each
case is classified as

* ``refused_before_work``: exit status 2; ``names_it`` says whether the message carries
  the field (dotted, with ``_`` or ``-``) or the file the case damaged;
* ``reached_work_with_warning``: got to the work after a one-line warning;
* ``reached_work_silently``: got to the work and nothing was said;
* ``crashed``: exit status 1, an exception other than the sentinel, or no exit within
  `CASE_LIMIT_S` seconds (a bug).

The JSON holds the counts per kind and outcome, every case that reached the work silently
or crashed (argv, first message line), and the cases judged valid (`JUDGED_VALID`: a
value the run can legitimately take, with the reason).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import json
import os
import pathlib
import re
import signal
import sys
import tempfile
import warnings
from typing import Any

OUTCOMES = ("refused_before_work", "reached_work_with_warning", "reached_work_silently",
            "crashed")

_ZERO_MEANS = ("rl_steps|token_samples_every|seed|model\\.init_seed|task\\.eval_examples|"
               "task\\.chain_min_solution_chars|sampling\\.min_p|advantages\\.(eps|std_ddof)|"
               "optim\\.(warmup_steps|total_steps|final_lr_fraction|weight_decay|b1|b2)|"
               "sampler\\.logit_noise_std|checkpoint\\.(every|sft_every)|"
               "staleness\\.(inter_lag|max_inter_lag|intra_switches|seed|max_staleness)|"
               "sft\\.(steps|warmup_steps)|sampler\\.fleet\\.request_timeout_per_token_s")
# (kind, label pattern) of cases that reach the work because the value is a valid one,
# with why; `judged_valid` matches a case's label against them in order
JUDGED_VALID: dict[tuple[str, str], str] = {
    ("control", r"the base configuration"): "the probe's base run, which must reach the work",
    ("config", rf"({_ZERO_MEANS})='0'"):
        "0 is a documented value of the field (off, never, all, no warm-up or decay)",
    ("config", r"objective\.\w+\.\w+='(0|inf|1e30)'"):
        "inside the objective's documented range (its config checks it; inf = no bound, "
        "0 = no room on that side or no penalty)",
    ("config", r"[\w.]+=''"): "empty is the field's documented default (none, or the default "
                              "location)",
    ("config", r"(sampling\.top_k|sampler\.num_devices|learner\.mesh\.data)='-1'"):
        "-1 is documented (filter off / every local device / the devices left over)",
    ("config", r"sampler\.fleet\.\w+='1e30'"):
        "a timeout or wait long enough never to expire: the fleet's documented limits are "
        "lower bounds only",
    ("config", r"(sampling\.temperature|sampler\.logit_noise_std|advantages\.eps|"
               r"optim\.(learning_rate|eps|weight_decay|max_grad_norm)|sft\.learning_rate|"
               r"verifier\.timeout_s)='1e30'"):
        "finite and in range: a useless run (uniform sampling, zero advantages or updates, "
        "no clipping, a divergence that learner.max_bad_steps stops, no time limit), not an "
        "invalid one",
    ("config", r"logging\.wandb_(project|entity|group)='bogus'"):
        "a free-form W&B name (read only with --logging.wandb)",
    ("model_files", r"(tokenizer_config|generation_config)\.json missing"):
        "optional in the Hugging Face layout: the tokenizer's defaults and its end-of-sequence "
        "token apply (a present but damaged file is refused)",
    ("model_files", r"config\.json hidden_size a string"):
        "config.json's \"32\" is read as the integer 32 (the same model)",
}


def judged_valid(kind: str, label: str) -> str | None:
    """Why the case ``(kind, label)`` is a valid value (`JUDGED_VALID`), or None."""
    return next((why for (k, pattern), why in JUDGED_VALID.items()
                 if k == kind and re.fullmatch(pattern, label)), None)


class _ReachedWork(BaseException):
    """Raised where the run's first real work would start (not an Exception: ``main``
    must not turn it into an exit status)."""


class _Hung(BaseException):
    """Raised by the alarm when a case has not finished within `CASE_LIMIT_S`."""


CASE_LIMIT_S = 30  # seconds a case may take before it counts as hung (a crash)


def _hung(signum, frame):
    raise _Hung


def small_model(path: pathlib.Path) -> pathlib.Path:
    """A 2-layer Qwen2 checkpoint with the embedded tokenizer (as tests/conftest.py's)."""
    import shutil

    from flax import nnx

    from entr_jax.assets import tiny_dir
    from entr_jax.model import Decoder, ModelConfig, save_pretrained

    hf = json.loads((tiny_dir() / "config.json").read_text())
    hf.update(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    save_pretrained(Decoder(ModelConfig.from_hf_config(hf), rngs=nnx.Rngs(0)), str(path))
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(tiny_dir() / name, path / name)
    return path


def _message(err: str) -> str:
    """stderr without tyro's box drawing, whitespace collapsed, notes left out."""
    lines = [ln for ln in err.splitlines() if not ln.startswith("entr-run: note:")]
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", "\n".join(lines)).split())


def _names(message: str, name: str) -> bool:
    """Whether ``message`` names ``name``: dotted (with ``_`` or ``-``), or as its section
    and its class's field (``Error parsing objective.entr: EntrConfig.tau must be ...``)."""
    if any(form in message for form in {name, name.replace("_", "-")}):
        return True
    section, _, leaf = name.rpartition(".")
    return bool(section) and section in message and f".{leaf} " in message


def try_case(argv: list[str]) -> dict[str, Any]:
    """Run ``entr-run argv`` in this process, stopped at the work; the outcome record."""
    from experiments.run import build as job_module
    from experiments.run import cli

    def reached(*args, **kwargs):
        raise _ReachedWork

    err, code, escaped = io.StringIO(), None, None
    saved = job_module.CheckpointManager
    job_module.CheckpointManager = reached
    previous = signal.signal(signal.SIGALRM, _hung)
    signal.alarm(CASE_LIMIT_S)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), \
                warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                code = cli.main(argv)
            except SystemExit as e:  # tyro's own parse errors
                code = e.code
            except _ReachedWork:
                code = "work"
            except _Hung:
                escaped = f"hung: no exit within {CASE_LIMIT_S} s"
            except Exception as e:  # noqa: BLE001 - escaped main: a bug
                escaped = f"{type(e).__name__}: {e}"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        job_module.CheckpointManager = saved
    said = [str(w.message).splitlines()[0] for w in caught
            if not issubclass(w.category, (DeprecationWarning, PendingDeprecationWarning,
                                           FutureWarning))]
    said += [ln for ln in err.getvalue().splitlines() if ln.startswith("entr-run: warning:")]
    message = escaped or _message(err.getvalue())
    if code == "work":
        outcome = "reached_work_with_warning" if said else "reached_work_silently"
        message = said[0] if said else ""
    elif code == 2:
        outcome = "refused_before_work"
    else:
        outcome = "crashed"
    return {"outcome": outcome, "exit": code if code != "work" else None,
            "message": message[:400]}


def run_cases(cases, root: pathlib.Path, model_dir: pathlib.Path,
              progress: bool = False) -> list[dict[str, Any]]:
    """Every case in its own folder under ``root``; one record per case."""
    from benchmarks.bad_input_cases import argv as case_argv

    records = []
    for i, case in enumerate(cases):
        work = root / f"case{i:04d}"
        work.mkdir(parents=True)
        (work / "a_file").write_text("not a directory\n")
        args = case_argv(case, work, model_dir)
        record = {"kind": case.kind, "label": case.label, "names": case.names, "argv": args,
                  **try_case(args)}
        if record["outcome"] == "refused_before_work":
            record["names_it"] = _names(record["message"], case.names)
        records.append(record)
        if progress:
            print(f"{i + 1}/{len(cases)} {case.kind} {case.label}: {record['outcome']}",
                  file=sys.stderr, flush=True)
    return records


def tally(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts per kind and outcome (and refusals that name the field or file), the cases
    that reached the work silently or crashed, and the judged-valid ones with reasons."""
    counts: dict[str, dict[str, int]] = collections.defaultdict(
        lambda: dict.fromkeys(OUTCOMES + ("refused_naming_it",), 0))
    for r in records:
        for kind in (r["kind"], "total"):
            counts[kind][r["outcome"]] += 1
            counts[kind]["refused_naming_it"] += bool(r.get("names_it"))
    unsaid = [r for r in records if r["outcome"] in ("reached_work_silently", "crashed")]
    faults = [r for r in unsaid
              if r["outcome"] == "crashed" or not judged_valid(r["kind"], r["label"])]
    valid = [{"kind": r["kind"], "label": r["label"], "outcome": r["outcome"],
              "reason": judged_valid(r["kind"], r["label"])}
             for r in unsaid if r not in faults]
    return {"cases": len(records), "counts": dict(counts), "faults": faults,
            "judged_valid": valid,
            "refused_not_naming_it": [
                {k: r[k] for k in ("kind", "label", "message")} for r in records
                if r["outcome"] == "refused_before_work" and not r.get("names_it")]}


def select(cases, kinds: list[str] | None, fields: list[str] | None):
    """The cases of ``kinds`` (all when None) whose label starts with one of ``fields``."""
    return [c for c in cases if (not kinds or c.kind in kinds)
            and (not fields or any(c.label.startswith(f) for f in fields))]


def probe(kinds: list[str] | None = None, fields: list[str] | None = None,
          progress: bool = False) -> dict[str, Any]:
    """Build the small model, run the selected cases, return the tally and the records."""
    from benchmarks import bad_input_cases
    from experiments.run.cli import parse

    env = {"ENTR_DATA_OFFLINE": "1", "ENTR_JAX_CACHE": "0", "ENTR_DATA_DIR": ""}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        with tempfile.TemporaryDirectory(prefix="entr-bad-inputs-") as tmp:
            root = pathlib.Path(tmp)
            model_dir = small_model(root / "model")

            def saved_config(run_dir: str) -> str:
                case = bad_input_cases.Case("base", "base", {}, names="")
                base = bad_input_cases.argv(case, root, model_dir)
                return parse(base + ["--run_dir", run_dir])[0].to_json()

            control = bad_input_cases.Case("control", "the base configuration", {}, names="")
            cases = [control] + select(bad_input_cases.all_cases(model_dir, saved_config),
                                       kinds, fields)
            records = run_cases(cases, root / "cases", model_dir, progress)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return {**tally(records), "records": records}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the JSON file to write")
    parser.add_argument("--kinds", nargs="*", help="only these kinds (default: all)")
    parser.add_argument("--fields", nargs="*", help="only cases whose label starts so")
    parser.add_argument("--quiet", action="store_true", help="no per-case progress")
    args = parser.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    result = probe(args.kinds, args.fields, progress=not args.quiet)
    pathlib.Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({"cases": result["cases"], "counts": result["counts"]}, indent=2))


if __name__ == "__main__":
    main()
