"""Checkpoint side items of the RL loop: the delay line's parked batches (JSON) and the
parameter ring (``.npz`` next to each orbax checkpoint)."""

from __future__ import annotations

import pathlib
from typing import Any, Iterable

import jax
import jax.numpy as jnp
import numpy as np

from entr_jax.staleness import DelayLine, ParamRing
from experiments.rollouts import RolloutBatch


def delay_line_json(line: DelayLine, pending: Iterable[RolloutBatch], next_step: int) -> dict:
    """JSON of a delay line about to resume at ``next_step`` with these parked batches."""
    return {
        "consumed": max(line.state_dict()["consumed"], next_step),
        "pending": {str(b.batch_id): b.to_json() for b in pending},
    }


def load_delay_line(line: DelayLine, state: dict) -> None:
    """Inverse of `delay_line_json` (float32 values round-trip exactly through JSON)."""
    line.load_state_dict({
        "consumed": state["consumed"],
        "pending": {int(k): RolloutBatch.from_json(b) for k, b in state["pending"].items()},
    })


def save_ring(path: pathlib.Path, ring: ParamRing) -> None:
    """Every version in ``ring`` as flat leaves ``v{version}_{i}`` plus ``versions``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    flat = {f"v{v}_{i}": np.asarray(leaf)
            for v in ring.versions for i, leaf in enumerate(jax.tree.leaves(ring.get(v)))}
    np.savez(path, versions=np.array(ring.versions), **flat)


def load_ring(path: pathlib.Path, ring: ParamRing, template: Any) -> None:
    """Push the versions saved by `save_ring` into ``ring`` (structure of ``template``)."""
    treedef = jax.tree.structure(template)
    with np.load(path) as z:
        for v in z["versions"].tolist():
            leaves = [jnp.asarray(z[f"v{v}_{i}"]) for i in range(treedef.num_leaves)]
            ring.push(int(v), jax.tree.unflatten(treedef, leaves))


def prune_rings(ring_dir: pathlib.Path, kept_steps: Iterable[int]) -> None:
    """Delete ring snapshots whose checkpoint step orbax no longer keeps."""
    kept = set(kept_steps)
    for f in pathlib.Path(ring_dir).glob("*.npz"):
        if int(f.stem) not in kept:
            f.unlink()
