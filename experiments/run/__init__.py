"""The main job: one training run (``entr-run``, `experiments.run.cli`).

Where to look, in the order a run goes:

* the configuration: `config` (`RunConfig`), its sections (`specs`, `sampler_specs`) and
  the presets (`configs`); bad input is refused by `preflight` and `errors`;
* the parts, built in one place: `build` (learner, sampler, episodes, objective,
  advantage function, rollout source) from the task (`tasks`) and the objective (`objective`);
* the phases of a run: `job` (evaluations `evaluation`/`shared_eval`, the warm start
  `warm_start`, RL, `summary`);
* one RL step: `loop.run_rl` (batch from the source, hooks, ``learner.train_on``,
  publish);
* staleness: `sources` (`SimulatedSource`: the seeded plan, ring and delay line) and
  `async_source` (`AsyncSource`: the sampler thread and its bound); the decomposition
  scoring in `decomposition`;
* what a step writes: `step_log` (``metrics.jsonl``), `rollouts` (rollout metrics),
  checkpoints `checkpointing` / `state_io`, resume rules `resume`, the run directory
  `rundir`.
"""


def __getattr__(name: str):
    """``experiments.run:entry`` keeps working for an install whose ``entr-run`` script
    predates `experiments.run.cli` (lazily: importing a module of this package does not
    import the command line)."""
    if name == "entry":
        from experiments.run.cli import entry

        return entry
    raise AttributeError(f"module 'experiments.run' has no attribute {name!r}")
