"""Many runs: sweeps (`sweep`, its specs `sweep_spec`), method comparisons
(`comparison`), pre-registered studies (`study`, `study_args`, `study_archive`) and the
async speed-up model (`speedup_model`). Specs live in ``experiments/sweeps/`` and
``experiments/studies/``; ``python -m experiments.sweep`` and ``python -m
experiments.study`` run these modules."""
