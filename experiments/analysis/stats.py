"""Across-seed statistics of sweep rows: per-method means with 95% intervals and paired
gaps between two methods (the stress regime's "async worse than sync" criterion).

Intervals are Student-t intervals over seeds: ``mean +- t_{0.975, n-1} * s / sqrt(n)`` with
``s`` the sample standard deviation (ddof = 1); NaN half-width for ``n < 2``. Rows are
`experiments.analysis.runs.sweep_rows` dicts (``method``, ``seed``, settings, values).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
from scipy import stats as _st


def mean_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float, int]:
    """``(mean, half_width, n)`` of the finite ``values`` (t interval, see module doc).

    Raises ValueError for ``level`` outside (0, 1)."""
    if not 0 < level < 1:
        raise ValueError(f"mean_ci: level must be in (0, 1), got {level}")
    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], np.float64)
    n = len(x)
    if n == 0:
        return float("nan"), float("nan"), 0
    if n == 1:
        return float(x[0]), float("nan"), 1
    half = _st.t.ppf(0.5 + level / 2, n - 1) * x.std(ddof=1) / math.sqrt(n)
    return float(x.mean()), float(half), n


def method_table(rows: Sequence[dict[str, Any]], value: str,
                 level: float = 0.95) -> dict[str, tuple[float, float, int]]:
    """Per method (sorted), `mean_ci` of ``row[value]`` over its rows (e.g. seeds)."""
    out = {}
    for method in sorted({r["method"] for r in rows}):
        out[method] = mean_ci([r[value] for r in rows if r["method"] == method], level)
    return out


def paired_gap(rows: Sequence[dict[str, Any]], a: str, b: str, value: str,
               level: float = 0.95) -> tuple[float, float, int]:
    """`mean_ci` of ``value(a) - value(b)`` over the seeds both methods ran.

    Each seed must appear at most once per method (one setting per call: filter the rows
    first); ValueError naming the duplicated (method, seed) otherwise."""
    per: dict[str, dict[int, float]] = {a: {}, b: {}}
    for r in rows:
        if r["method"] in per:
            if r["seed"] in per[r["method"]]:
                raise ValueError(f"paired_gap: method {r['method']!r} has seed {r['seed']} "
                                 "twice: filter the rows to one setting")
            per[r["method"]][r["seed"]] = r[value]
    seeds = sorted(set(per[a]) & set(per[b]))
    return mean_ci([per[a][s] - per[b][s] for s in seeds], level)


def excludes_zero(mean: float, half: float) -> bool:
    """Whether the interval ``mean +- half`` excludes 0 (False when it is undefined)."""
    return bool(math.isfinite(half) and abs(mean) > half)
