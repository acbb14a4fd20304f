"""Sweep specs: reading a spec (TOML), ``--set`` overrides, and expanding its grids,
comparison methods and seeds into runs (`SweepRun`: a name, a directory, CLI overrides).

The spec format and how a run's selection prunes the fields it does not read are described
in `experiments.multirun.sweep`, which runs, emits and summarises the expanded runs.
"""

from __future__ import annotations

import dataclasses
import itertools
import pathlib
import sys
import tomllib
from typing import Any

from experiments.multirun import comparison


SHARED_EVAL = "shared_eval"  # <out>/shared_eval: the runs' shared initial evaluation


@dataclasses.dataclass(frozen=True)
class SweepRun:
    """One point of a sweep: its name, directory and CLI overrides."""

    name: str
    run_dir: pathlib.Path
    overrides: dict[str, Any]

    def command(self, preset: str, resume: bool = False) -> list[str]:
        args = [sys.executable, "-m", "experiments.run", preset, "--run_dir", str(self.run_dir)]
        if "shared_eval_dir" not in self.overrides:  # [fixed] or --set may say otherwise
            args += ["--shared_eval_dir", str(self.run_dir.parent / SHARED_EVAL)]
        for key, value in self.overrides.items():
            if isinstance(value, bool):  # tyro's boolean flags: --a.b / --a.no_b
                head, _, leaf = key.rpartition(".")
                args.append(f"--{key}" if value else f"--{head + '.' if head else ''}no_{leaf}")
            else:
                args += [f"--{key}", _cli_value(value)]
        if resume:
            args.append("--resume")
        return args


def parse_set(items: list[str] | None) -> dict[str, Any]:
    """``["a.b=1", "c=x/y"]`` -> ``{"a.b": 1, "c": "x/y"}``: each VALUE read as a TOML value
    (numbers, booleans, quoted strings, arrays), else kept as the string it is.

    Raises:
      ValueError: an item without ``=`` or with an empty key.
    """
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set {item!r}: expected KEY=VALUE, e.g. --set rl_steps=10")
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw
        out[key.strip()] = value
    return out


def apply_set(spec: dict[str, Any], sets: dict[str, Any]) -> dict[str, Any]:
    """The spec with ``sets`` merged into its ``[fixed]`` table (a new dict; `parse_set`).

    Raises:
      ValueError: a key one of the spec's grids varies, or a ``[comparison]`` method sets
        (that value would win).
    """
    varied = sorted({k for grid in spec["grid"] for k in grid if k in sets})
    if varied:
        raise ValueError(f"--set {', '.join(varied)}: varied by the spec's grid; edit the grid")
    per_method = sorted({k for _, o in comparison.method_points(spec) for k in o if k in sets})
    if per_method:
        raise ValueError(f"--set {', '.join(per_method)}: set per method by the spec's "
                         "[comparison] table; edit the table")
    return {**spec, "fixed": {**spec["fixed"], **sets}}


def _cli_value(value: Any) -> str:
    if isinstance(value, bool):
        return "True" if value else "False"
    return str(value)


def _slug(key: str, value: Any) -> str:
    return f"{key.split('.')[-1]}={_cli_value(value)}".replace("/", "_")


def load_spec(path: str | pathlib.Path) -> dict[str, Any]:
    """Read and check a sweep spec; errors name the offending key."""
    with open(path, "rb") as f:
        spec = tomllib.load(f)
    return check_spec(spec, path)


def check_spec(spec: dict[str, Any], path: str | pathlib.Path) -> dict[str, Any]:
    """Check a sweep spec read from ``path`` (named in the errors) and fill its defaults
    (``seeds`` [0], one empty grid, no ``fixed``); returns it. ValueError names the key."""
    unknown = set(spec) - {"preset", "seeds", "grid", "fixed", "comparison", "map"}
    if unknown:
        raise ValueError(f"sweep spec {path}: unknown keys {sorted(unknown)}")
    if "map" in spec:
        spec["grid"] = map_grids(spec, path)
    if not isinstance(spec.get("preset"), str):
        raise ValueError(f"sweep spec {path}: 'preset' (a preset name) is required")
    seeds = spec.setdefault("seeds", [0])
    if not seeds or not all(isinstance(s, int) for s in seeds):
        raise ValueError(f"sweep spec {path}: 'seeds' must be a non-empty list of ints")
    grids = spec.setdefault("grid", [{}])
    if isinstance(grids, dict):
        spec["grid"] = grids = [grids]
    for i, grid in enumerate(grids):
        for key, values in grid.items():
            if not isinstance(values, list) or not values:
                raise ValueError(f"sweep spec {path}: grid[{i}].{key} must be a non-empty list")
    spec.setdefault("fixed", {})
    if "comparison" in spec:
        comparison.parse_methods(spec, f"sweep spec {path}")
    return spec


MAP_AXES = ("inter_lag", "intra_switches")


def map_grids(spec: dict[str, Any], path: str | pathlib.Path) -> list[dict[str, list]]:
    """The grids of a staleness tolerance map (a ``[map]`` table, read by
    `experiments.analysis.tolerance`): the inter axis ``staleness.inter_lag`` at the first
    ``intra_switches`` value, and the intra axis ``staleness.intra_switches`` at the first
    ``inter_lag`` value, so both axes cross at ``(inter_lag[0], intra_switches[0])``::

        [map]
        inter_lag = [0, 4, 8, 16, 32]
        intra_switches = [0, 3, 9]

    ValueError (naming the key and the fix) for a map beside ``[[grid]]``, one without a
    ``[comparison]`` (its methods are the map's lines), an unknown key, or an axis that
    is not a non-empty list of distinct non-negative ints."""
    where = f"sweep spec {path}: [map]"
    if "comparison" not in spec:
        raise ValueError(f"{where} needs a [comparison] table: its methods are the map's "
                         "lines (see experiments/sweeps/tolerance_map.toml)")
    m = spec["map"]
    if not isinstance(m, dict) or set(m) != set(MAP_AXES):
        raise ValueError(f"{where} must have exactly the keys {list(MAP_AXES)}, got "
                         f"{sorted(m) if isinstance(m, dict) else m!r}")
    for key in MAP_AXES:
        v = m[key]
        if (not isinstance(v, list) or not v or len(set(v)) != len(v)
                or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v)):
            raise ValueError(f"{where}.{key} must be a non-empty list of distinct ints >= 0 "
                             f"(the first is where the axes cross), got {v!r}")
    inter, intra = m["inter_lag"], m["intra_switches"]
    grids = [{"staleness.inter_lag": list(inter), "staleness.intra_switches": [intra[0]]},
             {"staleness.inter_lag": [inter[0]], "staleness.intra_switches": list(intra)}]
    if spec.get("grid", grids) != grids:  # a spec checked again keeps the map's own grids
        raise ValueError(f"{where} builds the grid itself: remove the [[grid]] tables "
                         "(or run that grid as a separate sweep)")
    return grids


def _selection_reads(spec: dict[str, Any], point: dict[str, Any]):
    """``reads(field)``: whether this run's selection (staleness mode, sampler kind, task,
    objective: `experiments.run.config.SELECTED_FIELDS`) reads a field."""
    from experiments.run.config import dotted, selector_of
    from experiments.run.configs import PRESETS

    preset = PRESETS[spec["preset"]][1] if spec["preset"] in PRESETS else None

    def reads(key: str) -> bool:
        rule = selector_of(key)
        if rule is None:
            return True
        selector, values = rule
        chosen = point.get(selector, spec["fixed"].get(
            selector, dotted(preset, selector) if preset else None))
        return chosen is None or chosen in values
    return reads


def expand(spec: dict[str, Any], out_dir: str | pathlib.Path) -> list[SweepRun]:
    """All runs of a spec, deduplicated, in a stable order. Fixed fields the run's
    selection does not read are left out (see the module docstring)."""
    from experiments.run.config import selector_of

    out_dir = pathlib.Path(out_dir)
    runs: dict[str, SweepRun] = {}
    methods = comparison.method_points(spec)  # [("", {})] without a [comparison] table
    for grid in spec["grid"]:
        keys = list(grid)
        for values in itertools.product(*(grid[k] for k in keys)):
            for label, method in methods:
                for seed in spec["seeds"]:
                    point = dict(zip(keys, values))
                    reads = _selection_reads(spec, {**method, **point})
                    # a method's selection (e.g. grpo_sync's mode) does not read some of
                    # the grid's fields (its lags): they leave its overrides and its name,
                    # so the baseline runs once per remaining setting instead of once per
                    # lag; a grid that names the selector itself keeps every field (a
                    # contradiction is the CLI's error to report)
                    point = {k: v for k, v in point.items()
                             if reads(k) or (selector_of(k) or ("",))[0] in point}
                    slugs = [label] if label else []
                    name = "_".join(slugs + [_slug(k, v) for k, v in point.items()]
                                    + [f"seed={seed}"])
                    fixed = {k: v for k, v in spec["fixed"].items() if reads(k)}
                    overrides = {**fixed, **method, **point, "seed": seed}
                    runs.setdefault(name, SweepRun(name, out_dir / name, overrides))
    return list(runs.values())
