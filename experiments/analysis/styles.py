"""How every figure draws a method, a seed and a number: one colour and line style per
method (distinct from every other method's in both, so a figure reads in grey too), one
marker per seed, labels with the digits that matter, and the "no data" mark of an empty
bin or panel. Plain values: no matplotlib import here.

A method is named as its sweep names it (`experiments.analysis.runs.Run.method`:
``grpo_async``, ``entr@1``, ``grpo sync``); a tuned candidate ``entr@1`` is drawn as its
method ``entr``.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

# (colour, line style) per method: no two share either. Line styles are matplotlib dash
# tuples, distinguishable in print.
_LINES = {
    "solid": "-", "dashed": (0, (5, 2)), "dashdot": (0, (6, 2, 1, 2)), "dotted": (0, (1, 1.5)),
    "long": (0, (10, 3)), "dashdotdot": (0, (6, 2, 1, 2, 1, 2)), "short": (0, (2, 2)),
    "longdot": (0, (10, 2, 1, 2)), "loose": (0, (3, 5)), "dense": (0, (3, 1, 1, 1)),
    "longdotdot": (0, (12, 2, 1, 2, 1, 2)), "sparse": (0, (1, 4)), "twodash": (0, (8, 2, 3, 2)),
}
METHOD_STYLES: dict[str, tuple[str, Any]] = {
    "entr": ("#d62728", _LINES["solid"]),          # red
    "entr_rule": ("#7f0000", _LINES["loose"]),     # dark red: ENTR, tau from the rule
    "grpo_async": ("#1f77b4", _LINES["dashed"]),   # blue
    "grpo": ("#1f77b4", _LINES["dashed"]),         # the same method as grpo_async
    "grpo_sync": ("#000000", _LINES["dotted"]),    # black: the on-policy reference
    "grpo sync": ("#000000", _LINES["dotted"]),
    "icepop": ("#2ca02c", _LINES["dashdot"]),      # green
    "kpop": ("#ff7f0e", _LINES["long"]),           # orange
    "trm": ("#9467bd", _LINES["dashdotdot"]),      # purple
    "tis": ("#7f7f7f", _LINES["short"]),           # grey
    "m2po": ("#8c564b", _LINES["longdot"]),        # brown
    "decoupled_ppo": ("#17becf", (0, (4, 1, 4, 4))),  # cyan
    "gspo": ("#e377c2", _LINES["dense"]),          # pink
    "cispo": ("#bcbd22", _LINES["longdotdot"]),    # olive
    "vespo": ("#393b79", _LINES["sparse"]),        # navy
    "sat": ("#ad494a", _LINES["twodash"]),         # brick
}
_SPARE_COLOURS = ("#637939", "#7b4173", "#6b6ecf", "#9c9ede", "#e7969c", "#5254a3")
_SPARE_LINES = ((0, (2, 1, 2, 4)), (0, (7, 1, 1, 1, 1, 1, 1, 1)), (0, (9, 1)))
SEED_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*")
NO_DATA = "no data"


def base_method(name: str) -> str:
    """``entr@1`` -> ``entr`` (a tuned candidate is drawn as its method)."""
    return name.split("@", 1)[0]


def method_style(name: str) -> dict[str, Any]:
    """``{"color", "linestyle"}`` of method ``name`` (`METHOD_STYLES`; an unknown name gets
    a spare colour and dash pattern chosen by a stable hash of the name)."""
    key = base_method(name)
    if key in METHOD_STYLES:
        color, line = METHOD_STYLES[key]
    else:
        h = sum(ord(c) * 31 ** i for i, c in enumerate(key))
        color, line = _SPARE_COLOURS[h % len(_SPARE_COLOURS)], _SPARE_LINES[h % len(_SPARE_LINES)]
    return {"color": color, "linestyle": line}


def seed_marker(seed: int, seeds: Sequence[int]) -> str:
    """The marker of ``seed`` among ``seeds`` (sorted, one marker each)."""
    return SEED_MARKERS[sorted(set(seeds)).index(seed) % len(SEED_MARKERS)]


def fmt(x: float, digits: int = 2) -> str:
    """``x`` to ``digits`` significant digits (``nan`` as is): what a legend shows."""
    return "nan" if x is None or not math.isfinite(x) else f"{x:.{digits}g}"


def interval(ci: Sequence[float] | None) -> str:
    """``[lo, hi]`` with the decimals that tell the two ends apart (two significant digits
    of their difference: ``[0.65, 4.09]`` -> ``[0.7, 4.1]``, ``[1.6149, 1.7239]`` ->
    ``[1.61, 1.72]``), or ``[n/a]`` when there is none."""
    if not ci or len(ci) != 2 or not all(v is not None and math.isfinite(v) for v in ci):
        return "[n/a]"
    lo, hi = float(ci[0]), float(ci[1])
    if hi == lo:
        return f"[{fmt(lo, 3)}, {fmt(hi, 3)}]"
    decimals = min(8, max(0, 1 - math.floor(math.log10(abs(hi - lo)))))
    return f"[{lo:.{decimals}f}, {hi:.{decimals}f}]"


def mark_no_data(ax, what: str = NO_DATA) -> None:
    """Write ``what`` ("no data") in the middle of an axes that has nothing to draw."""
    ax.text(0.5, 0.5, what, transform=ax.transAxes, ha="center", va="center",
            fontsize=10, color="0.4")
