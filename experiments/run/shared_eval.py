"""One evaluation of the starting weights for every run that would compute the same one.

A sweep's runs from one warm start differ in the objective, the optimizer or the staleness
of RL, not in the policy they start from: each run's initial evaluation (``eval/init.json``,
also its before-RL evaluation when it trains no SFT) is the same numbers, computed once per
run. With ``shared_eval_dir`` set (the sweep tool sets ``<out>/shared_eval``), the first run
computes it and stores it as ``<shared_eval_dir>/<key>.json``; a later run with the same
key reads it instead of evaluating, and writes the same ``eval/init.json``, plus
``eval/init_source.json`` (the key, the stored file and whether this run computed it).

The key is conservative: the SHA-256 of every config field except those of `NOT_READ`
(fields the initial evaluation never reads: labels, where a run writes, and what only RL
steps read), with ``model.path`` replaced by the bytes of every file under it (weights,
tokenizer, configs), and the package version. So a changed warm start, evaluation set,
sampler, sampling filter, seed, model, learner placement or tokenizer gives a new key;
only the objective, the optimizer, the advantage estimator, the staleness, the run length
and the logging share one. `tests/test_shared_eval.py` checks that a run which reads the
stored evaluation writes the same ``eval/*.json``, ``metrics.jsonl`` and summary values
(wall times aside) as one that computes it, and that sync, simulated-stale and async runs
compute identical initial evaluations, which is what lets `NOT_READ` hold ``staleness``.

Concurrent runs with one key wait on a file lock (`filelock`) while the first computes.
With several processes, process 0 decides (lock, lookup) and its decision and result are
gathered to every process (`experiments.run.multiprocess.allgather_json`), so every process
takes the same branch of the collective evaluation.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pathlib
from typing import Any, Callable

import filelock
import jax

from experiments.run import multiprocess as mp
from experiments.run.fields import LABEL_FIELDS, flatten

# Top-level RunConfig fields the evaluation of the starting weights does not read.
NOT_READ = LABEL_FIELDS + ("rl_steps", "token_samples_every", "advantages", "objective",
                           "optim", "staleness", "checkpoint", "logging")


def _weights_digest(model_path: str) -> str:
    """SHA-256 over the relative names and bytes of every file under ``model_path``
    (empty string: no path, the init is set by the ``model`` fields in the key)."""
    if not model_path:
        return ""
    root = pathlib.Path(model_path)
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def _item(value: Any) -> Any:
    """numpy scalars as the Python number of the same kind (16 stays 16, not 16.0)."""
    return value.item()


def key(config: dict[str, Any]) -> str:
    """The sharing key of a run's ``config.json`` dict (hex SHA-256; see the module doc)."""
    from entr_jax import __version__

    fields = {k: v for k, v in flatten(config).items()
              if k.split(".")[0] not in NOT_READ and k != "model.path"}  # path: by its bytes
    ident = {"fields": fields, "weights": _weights_digest(config["model"]["path"]),
             "version": __version__}
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()


def initial_evaluation(config: dict[str, Any], compute: Callable[[], dict[str, Any]],
                       replay: Callable[[dict[str, Any]], None],
                       note: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """The evaluation of the starting weights: ``compute()`` (which writes
    ``eval/init.json`` itself), or, when ``config["shared_eval_dir"]`` holds one with this
    key, the stored one, handed to ``replay`` (write ``eval/init.json``, log it).
    ``note(source)`` receives ``{"key", "stored", "computed"}`` for
    ``eval/init_source.json``. Without ``shared_eval_dir``: ``compute()``, nothing noted.
    A collective with several processes (every process calls it)."""
    share_dir = config.get("shared_eval_dir") or ""
    if not share_dir:
        return compute()
    k = key(config)
    stored = pathlib.Path(share_dir) / f"{k}.json"
    first = jax.process_index() == 0
    if first:
        stored.parent.mkdir(parents=True, exist_ok=True)
    lock = filelock.FileLock(str(stored) + ".lock") if first else contextlib.nullcontext()
    with lock:
        found = mp.allgather_json(json.loads(stored.read_text())
                                  if first and stored.exists() else None)[0]
        if found is not None:
            replay(found)
            out = found
        else:
            out = compute()
            if first:
                tmp = stored.with_name(stored.name + f".tmp{os.getpid()}")
                tmp.write_text(json.dumps(out, indent=1, default=_item))  # key order kept
                os.replace(tmp, stored)
    note({"key": k, "stored": str(stored), "computed": found is None})
    return out
