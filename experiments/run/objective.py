"""The run's objective: the registry config of ``objective.<name>`` with what the run fills in.

Dr.GRPO's aggregation ``seq_mean_token_sum_norm`` divides by a constant ``L_norm``, the
maximum generation length (arXiv 2503.20783, section 3.1). When the user gives no
``l_norm`` the job uses the task's generation budget in policy tokens,
``min(task.max_new_tokens * task.max_turns, task.max_total_tokens)`` (`response_budget`),
never the padded width of a batch. The resolved config is what ``summary.json`` records
under ``objective_config``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from entr_jax.objectives import OBJECTIVES, make_objective

__all__ = ["build_objective", "response_budget"]


def response_budget(task: Any) -> int:
    """Most policy tokens one episode can generate: ``max_new_tokens`` per turn over
    ``max_turns`` turns, bounded by ``max_total_tokens`` (`experiments.run.config.TaskSpec`)."""
    return int(min(task.max_new_tokens * task.max_turns, task.max_total_tokens))


def build_objective(cfg: Any):
    """``make_objective(cfg.objective.name, config)`` with the selected section as the
    config and ``l_norm`` filled in (see the module docstring); ``cfg`` is an
    `experiments.run.config.RunConfig`."""
    selected = cfg.objective.selected()
    library = OBJECTIVES[cfg.objective.name][1]  # the run's section is a subclass of it
    if type(selected) is not library:
        selected = library(**{f.name: getattr(selected, f.name)
                              for f in dataclasses.fields(library)})
    if selected.mode == "seq_mean_token_sum_norm" and selected.l_norm is None:
        selected = dataclasses.replace(selected, l_norm=float(response_budget(cfg.task)))
    return make_objective(cfg.objective.name, selected)
