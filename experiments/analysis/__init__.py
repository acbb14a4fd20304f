"""Analysis of run directories: what the notebooks in ``notebooks/`` plot.

* `experiments.analysis.runs`: loading (`load_run`, `load_runs`), curves against step and
  wall-clock (`curve`, `wall_clock`, `eval_points`), sweep tables (`sweep_rows`,
  `staleness_axis`, `final_reward`, `measured_staleness`), figure output (`save_figure`).
* `experiments.analysis.stats`: across-seed means with 95% t intervals per method
  (`mean_ci`, `method_table`) and paired gaps between two methods (`paired_gap`,
  `excludes_zero`).
* `experiments.analysis.regime`: the stress-regime search table, each stale setting against
  the sync baseline at the same learning rate, mismatch and run length, with the paired
  gap's 95% interval and collapse indicators (`regime_rows`, `format_rows`; also
  ``python -m experiments.analysis.regime RUN_DIR``).
* `experiments.analysis.methods`: the method-comparison table of a comparison sweep, per
  method over seeds (held-out accuracy, gain, final reward, mask and clip fractions, the
  paired gap to a reference method, collapse indicators; ``python -m
  experiments.analysis.methods RUN_DIR``).
* `experiments.analysis.tokens`: the ratio-vs-entropy analysis of ESTR (arXiv 2607.22186,
  section 3.1) on stored token samples (`load_tokens`, `bin_by_entropy`, `wls_fit`,
  `fit_bins`, `bootstrap_slope`, `off_mode_outliers`) and where the gates cut
  (`gate_decisions`, `entr_band`, `icepop_band`, `kpop_band`, `cut_fraction_by_bin`).

Everything is re-exported here: ``from experiments import analysis as A``.
"""

from experiments.analysis.runs import (
    FIGURES_ENV, RUNS_ENV, Run, by_method, curve, eval_points, final_reward, load_run, load_runs,
    measured_staleness, moving_average, runs_root, save_figure, staleness_axis, sweep_rows,
    wall_clock,
)
from experiments.analysis.stats import excludes_zero, mean_ci, method_table, paired_gap
from experiments.analysis.tokens import (
    LOW_ENTROPY_NATS, Fit, Tokens, bin_by_entropy, bootstrap_slope, concat_tokens,
    cut_fraction_by_bin, entr_band, fit_bins, gate_decisions, gate_params, icepop_band, kpop_band,
    load_tokens, metric_buckets, off_mode_outliers, quantile_edges, wls_fit,
)

__all__ = [
    "FIGURES_ENV", "RUNS_ENV", "Run", "by_method", "curve", "eval_points", "final_reward",
    "load_run", "load_runs", "measured_staleness", "moving_average", "runs_root", "save_figure",
    "staleness_axis", "sweep_rows", "wall_clock",
    "excludes_zero", "mean_ci", "method_table", "paired_gap",
    "LOW_ENTROPY_NATS", "Fit", "Tokens", "bin_by_entropy", "bootstrap_slope", "concat_tokens",
    "cut_fraction_by_bin", "entr_band", "fit_bins", "gate_decisions", "gate_params",
    "icepop_band", "kpop_band", "load_tokens", "metric_buckets", "off_mode_outliers",
    "quantile_edges", "wls_fit",
]
