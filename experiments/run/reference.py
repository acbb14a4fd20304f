"""The frozen reference policy of the KL term (``logp_ref``).

GRPO's k3 KL to a reference (``--objective.grpo.kl_coef 0.04``; DeepSeekMath, arXiv
2402.03300, eq. 3-4) pulls the policy towards a frozen pi_ref. The job's reference is the
policy RL starts from (the warm start): the weights after the supervised warm start, else
those loaded from ``model.path``, else the initial weights. It is kept only when the
objective reads ``logp_ref`` (``objective.inputs``), so other runs pay neither its memory
nor the extra forward pass per rollout batch.

It is written once, when RL starts, to ``<run_dir>/reference.npz``; ``--resume`` reads it
back bit for bit (a resumed run's KL term is the uninterrupted run's).
"""

from __future__ import annotations

import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["FILE", "attach", "load", "needed", "save"]

FILE = "reference.npz"


def needed(objective: Any) -> bool:
    """Whether ``objective`` (an `entr_jax.objectives.Objective`, or None) reads
    ``logp_ref`` (e.g. GRPO with ``kl_coef > 0``)."""
    return objective is not None and "logp_ref" in objective.inputs


def save(path: pathlib.Path, params: Any) -> None:
    """Every leaf of ``params`` as raw bytes with its dtype name (bfloat16 included)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    leaves = [np.asarray(x) for x in jax.tree.leaves(params)]
    np.savez(path, dtypes=np.array([str(x.dtype) for x in leaves]),
             **{f"leaf_{i}": x.reshape(-1).view(np.uint8) for i, x in enumerate(leaves)})


def load(path: pathlib.Path, template: Any) -> Any:
    """Inverse of `save`, with the tree structure and shapes of ``template``.

    Raises:
      FileNotFoundError: the file is missing (names it and why it is needed).
      ValueError: the file does not match ``template`` (leaf count, dtype or shape).
    """
    if not path.exists():
        raise FileNotFoundError(
            f"{path} is missing: the run's objective reads logp_ref, and its frozen reference "
            "policy (saved when RL started) is needed to resume it")
    leaves, treedef = jax.tree.flatten(template)
    with np.load(path) as z:
        dtypes = z["dtypes"].tolist()
        if len(dtypes) != len(leaves):
            raise ValueError(f"{path} holds {len(dtypes)} arrays, the policy has {len(leaves)}")
        out = []
        for i, (leaf, dtype) in enumerate(zip(leaves, dtypes)):
            if dtype != str(leaf.dtype):
                raise ValueError(f"{path}: array {i} has dtype {dtype}, the policy's is {leaf.dtype}")
            out.append(jnp.asarray(z[f"leaf_{i}"].view(np.dtype(leaf.dtype)).reshape(leaf.shape)))
    return jax.tree.unflatten(treedef, out)


def attach(learner: Any, run_dir: pathlib.Path, *, fresh: bool, write: bool = True) -> bool:
    """Give ``learner`` its reference policy when its objective needs one.

    Args:
      learner: a `learners.learner.Learner`.
      run_dir: the run directory (``reference.npz`` lives there).
      fresh: RL is starting now: the learner's current weights become the reference and
        are saved; otherwise (resume) the saved reference is loaded.
      write: whether this process writes files (process 0).

    Returns:
      whether a reference was attached.
    """
    if not needed(learner.objective):
        return False
    path = pathlib.Path(run_dir) / FILE
    if fresh:
        params = learner.state.params
        if write:
            save(path, params)
    else:
        params = load(path, template=learner.state.params)
    learner.set_reference(params)
    return True
