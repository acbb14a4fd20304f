"""Config dicts as dotted fields, and the fields that only label a run.

Shared by what compares runs' configurations (`experiments.multirun.comparison`,
`experiments.multirun.sweep`, `experiments.run.shared_eval`, `experiments.analysis`), so none of them
reaches into another for these."""

from __future__ import annotations

from typing import Any

# Top-level RunConfig fields that name a run or say where it writes; they change none of
# its values (the comparison, the sweep's --reuse, the regime pairing and the shared
# initial evaluation all leave them out).
LABEL_FIELDS = ("name", "run_dir", "shared_eval_dir")


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts as one dict of dotted keys (``{"optim": {"learning_rate": x}}`` ->
    ``{"optim.learning_rate": x}``); tuples become lists, as in ``config.json``."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = list(v) if isinstance(v, tuple) else v
    return out
