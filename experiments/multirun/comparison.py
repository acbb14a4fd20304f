"""The fair comparison protocol of method sweeps: one shared base, declared differences.

ESTR (arXiv 2607.22186, Sec. 6) compares methods that "share one configuration and differ
only in the token acceptance rule". A sweep spec (`experiments.multirun.sweep`) states that with a
``[comparison]`` table::

    [comparison]
    # every method's objective section inherits these (where its config has the field)
    base = { aggregation = "token_mean", l_norm = "None", clip_low = 0.2, clip_high = 0.28 }

    [comparison.methods.entr]            # one table per compared method (its label)
    objective = "entr"                   # registry name (entr_jax.objectives.OBJECTIVES)
    own = { tau = 1.0, eps = 0.01, entropy_source = "behavior_full",
            denominator = "all_tokens" }
    [comparison.methods.grpo_sync]
    objective = "grpo"
    own = { kl_coef = 0.0 }
    overrides = { "staleness.mode" = "sync" }   # declared non-objective differences

Each method becomes, for every grid point and seed of the spec, one run with the
overrides ``name = <label>``, ``objective.name``, ``objective.<objective>.<field>`` for
every base field its config has (unless ``own`` sets it) and every ``own`` field, then the
method's ``overrides``. Everything else (learning rate, batch, advantage estimator,
staleness, ...) comes from the preset, ``[fixed]`` and the grid, identical for every
method.

Rules (`check_methods` at load time, `violations` on resolved configs):

* every field of a method's objective config is either in ``base`` or declared in
  ``own`` (so the report lists every acceptance/weighting parameter that differs);
* ``own`` fields exist in that config; ``overrides`` keys are dotted run-config fields
  outside ``objective`` and must not be swept by the grid;
* after resolution, the fields in which a run differs from its base (`base_diff`) are
  within ``objective.name``, the method's ``own`` fields and ``overrides`` keys, and the
  base fields its config does not have (shown as ``n/a``; e.g. M2PO has no clip band).

Resolution (`resolve`) applies the dotted overrides to the preset with
``dataclasses.replace`` (each section's validation runs), as the job's command line does.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any, Iterable

from entr_jax.objectives import ALIASES, OBJECTIVES
from experiments.run.fields import LABEL_FIELDS, flatten

MISSING = "n/a"  # a base field the method's objective config does not have
_NOT_COMPARED = LABEL_FIELDS + ("seed",)  # and the seed axis


@dataclasses.dataclass(frozen=True)
class Method:
    """One compared method of a ``[comparison]`` table.

    Attributes:
      label: the table key (e.g. ``grpo_sync``); becomes the run's ``name``.
      objective: registry name of its objective.
      own: its own objective parameters (``objective.<objective>.<field>``).
      overrides: declared non-objective differences (dotted run-config fields).
    """

    label: str
    objective: str
    own: dict[str, Any]
    overrides: dict[str, Any]

    def allowed(self, base: dict[str, Any]) -> set[str]:
        """Effective fields (see `effective_fields`) this method may differ in from the base."""
        fields = _objective_fields(self.objective)
        return ({"objective.name"} | {f"objective.{f}" for f in self.own} | set(self.overrides)
                | {f"objective.{f}" for f in base if f not in fields})


def _objective_fields(name: str) -> list[str]:
    return [f.name for f in dataclasses.fields(OBJECTIVES[name][1])]


def _toml_value(value: Any) -> Any:
    """TOML has no null: the string ``"None"`` stands for Python None (as on the CLI)."""
    return None if value == "None" else value


def parse_methods(spec: dict[str, Any], where: str = "sweep spec") -> tuple[dict, list[Method]]:
    """``(base, methods)`` of a spec's ``[comparison]`` table; ValueError naming the key."""
    table = spec["comparison"]
    if not isinstance(table, dict) or set(table) - {"base", "methods"}:
        raise ValueError(f"{where}: [comparison] takes only 'base' and 'methods' "
                         f"(got {sorted(table) if isinstance(table, dict) else table!r})")
    base = {k: _toml_value(v) for k, v in table.get("base", {}).items()}
    methods_table = table.get("methods")
    if not isinstance(methods_table, dict) or not methods_table:
        raise ValueError(f"{where}: [comparison.methods] must hold at least one method table")
    methods = []
    for label, m in methods_table.items():
        key = f"comparison.methods.{label}"
        if not isinstance(m, dict) or set(m) - {"objective", "own", "overrides"}:
            raise ValueError(f"{where}: {key} takes 'objective', 'own', 'overrides'")
        name = m.get("objective")
        if name not in OBJECTIVES:
            raise ValueError(f"{where}: {key}.objective {name!r} is unknown; known: "
                             f"{sorted(OBJECTIVES)}")
        methods.append(Method(label, ALIASES.get(name, name),
                              {k: _toml_value(v) for k, v in m.get("own", {}).items()},
                              {k: _toml_value(v) for k, v in m.get("overrides", {}).items()}))
    check_methods(base, methods, spec, where)
    return base, methods


def check_methods(base: dict[str, Any], methods: list[Method], spec: dict[str, Any],
                  where: str = "sweep spec") -> None:
    """The load-time rules of the module docstring; ValueError naming the offending key."""
    every = set().union(*(_objective_fields(m.objective) for m in methods))
    unknown = sorted(set(base) - every)
    if unknown:
        raise ValueError(f"{where}: comparison.base field(s) {unknown} exist in no compared "
                         "method's objective config")
    grid_keys = set().union(*(set(g) for g in spec.get("grid", [{}])))
    for m in methods:
        key = f"comparison.methods.{m.label}"
        fields = _objective_fields(m.objective)
        bad = sorted(set(m.own) - set(fields))
        if bad:
            raise ValueError(f"{where}: {key}.own field(s) {bad} are not fields of "
                             f"objective {m.objective!r} ({fields})")
        cls = OBJECTIVES[m.objective][1]
        undeclared = [f for f in fields if f not in base and f not in m.own]
        if undeclared:
            defaults = {f.name: f.default for f in dataclasses.fields(cls) if f.name in undeclared}
            raise ValueError(f"{where}: {key} leaves objective.{m.objective} field(s) "
                             f"{undeclared} undeclared: put them in comparison.base or in "
                             f"{key}.own (defaults {defaults})")
        for k in m.overrides:
            if k.startswith("objective.") or k in _NOT_COMPARED:
                raise ValueError(f"{where}: {key}.overrides key {k!r} is not allowed "
                                 "(objective parameters go in 'own'; name/run_dir/seed are set "
                                 "by the sweep)")
            if k in grid_keys:
                raise ValueError(f"{where}: {key}.overrides key {k!r} is also swept by a grid")
    for k in grid_keys:
        if k == "objective.name" or k == "name":
            raise ValueError(f"{where}: grid key {k!r} is set by [comparison.methods]")


def method_overrides(base: dict[str, Any], method: Method) -> dict[str, Any]:
    """The run overrides of one method (see the module docstring), in a stable order."""
    fields = _objective_fields(method.objective)
    out: dict[str, Any] = {"name": method.label, "objective.name": method.objective}
    for f in fields:
        if f in method.own:
            out[f"objective.{method.objective}.{f}"] = method.own[f]
        elif f in base:
            out[f"objective.{method.objective}.{f}"] = base[f]
    out.update(method.overrides)
    return out


# ------------------------------------------------------------------ resolution and diffs
def resolve(preset_name: str, overrides: dict[str, Any]):
    """The `RunConfig` of a preset with dotted overrides applied (validation included).

    Raises ValueError naming an unknown field."""
    from experiments.run.configs import PRESETS

    if preset_name not in PRESETS:
        raise ValueError(f"unknown preset {preset_name!r}; known presets: {sorted(PRESETS)}")
    cfg = PRESETS[preset_name][1]
    for key, value in overrides.items():
        cfg = _replace_path(cfg, key.split("."), value, key)
    return cfg


def _replace_path(obj: Any, parts: list[str], value: Any, key: str) -> Any:
    names = {f.name for f in dataclasses.fields(obj)}
    if parts[0] not in names:
        raise ValueError(f"override {key!r}: {type(obj).__name__} has no field {parts[0]!r}")
    if len(parts) == 1:
        return dataclasses.replace(obj, **{parts[0]: value})
    child = _replace_path(getattr(obj, parts[0]), parts[1:], value, key)
    return dataclasses.replace(obj, **{parts[0]: child})


def effective_fields(config: Any) -> dict[str, Any]:
    """Dotted fields of a run config (a `RunConfig` or its ``config.json`` dict) as the
    comparison sees them: the selected objective's section as ``objective.<field>``, the
    other objective sections dropped, ``name``/``run_dir``/``seed``/``shared_eval_dir``
    dropped."""
    d = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else config
    d = json.loads(json.dumps(d, default=str))  # tuples -> lists, as in config.json
    name = d["objective"]["name"]
    section = ALIASES.get(name, name)
    out = {k: v for k, v in flatten({x: y for x, y in d.items() if x != "objective"}).items()
           if k not in _NOT_COMPARED}
    out["objective.name"] = name
    out.update({f"objective.{k}": v for k, v in d["objective"][section].items()})
    return out


def base_fields(preset_name: str, base: dict[str, Any], shared: dict[str, Any]) -> dict[str, Any]:
    """The base a run is compared against: the preset with the shared (non-method)
    overrides of its grid point, and ``objective.<field>`` = the comparison base."""
    eff = effective_fields(resolve(preset_name, shared))
    out = {k: v for k, v in eff.items() if not k.startswith("objective.")}
    out.update({f"objective.{k}": v for k, v in base.items()})
    return json.loads(json.dumps(out, default=str))


def base_diff(fields: dict[str, Any], base: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{field: (run value, base value)}`` where they differ; `MISSING` marks a side that
    lacks the field."""
    keys = sorted(set(fields) | set(base))
    return {k: (fields.get(k, MISSING), base.get(k, MISSING)) for k in keys
            if fields.get(k, MISSING) != base.get(k, MISSING)}


@dataclasses.dataclass(frozen=True)
class RunCheck:
    """One run of a comparison sweep checked against its base.

    Attributes:
      run: run name; method: its method label.
      diff: `base_diff` of its resolved config.
      violations: differing fields the method did not declare (must be empty).
    """

    run: str
    method: str
    diff: dict[str, tuple[Any, Any]]
    violations: list[str]


def check_runs(spec: dict[str, Any], runs: Iterable[Any],
               configs: dict[str, dict] | None = None) -> list[RunCheck]:
    """Checks runs (`experiments.multirun.sweep.SweepRun` of a comparison spec) against their base.

    ``configs`` maps run names to their written ``config.json`` (the truth of a run that
    has started); other runs are resolved from their overrides. A written config that
    predates a field (runs stored before the field was added) is read onto the preset
    (`RunConfig.with_saved`), so that field takes its default, what those runs ran with,
    for every method alike instead of showing as a difference."""
    from experiments.run.configs import PRESETS

    base, methods = parse_methods(spec)
    by_label = {m.label: m for m in methods}
    out = []
    for run in runs:
        method = by_label[run.overrides["name"]]
        mine = set(method_overrides(base, method)) | {"seed"}
        shared = {k: v for k, v in run.overrides.items() if k not in mine}
        config = (configs or {}).get(run.name) or resolve(spec["preset"], run.overrides)
        if isinstance(config, dict) and spec["preset"] in PRESETS:
            config = PRESETS[spec["preset"]][1].with_saved(config)
        diff = base_diff(effective_fields(config), base_fields(spec["preset"], base, shared))
        allowed = method.allowed(base)
        out.append(RunCheck(run.name, method.label, diff, sorted(set(diff) - allowed)))
    return out


def format_report(checks: list[RunCheck]) -> str:
    """Per method, the resolved fields that differ from the base (one line per field,
    ``run value (base value)``), and any undeclared difference marked ``UNDECLARED``."""
    lines = ["Differences from the comparison base (per method; resolved configs):"]
    seen: dict[str, dict[str, tuple[Any, Any]]] = {}
    bad: dict[str, set[str]] = {}
    for c in checks:
        seen.setdefault(c.method, {}).update(c.diff)
        bad.setdefault(c.method, set()).update(c.violations)
    for label, diff in seen.items():
        lines.append(f"- {label}:")
        for k, (v, b) in diff.items():
            mark = "  UNDECLARED" if k in bad[label] else ""
            lines.append(f"    {k} = {v!r} (base {b!r}){mark}")
    return "\n".join(lines)


def write_spec(spec: dict[str, Any], out_dir: str | pathlib.Path) -> pathlib.Path:
    """Store the spec as ``<out>/sweep_spec.json`` so `summarize` can report against it."""
    path = pathlib.Path(out_dir) / "sweep_spec.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(spec, indent=1, sort_keys=True))
    return path


# ------------------------------------------------------------------ sweep integration
def method_points(spec: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """``[(name slug, overrides)]`` per compared method, or ``[("", {})]`` for a spec
    without ``[comparison]`` (the sweep multiplies its grid points by these)."""
    if "comparison" not in spec:
        return [("", {})]
    base, methods = parse_methods(spec)
    return [(f"method={m.label}", method_overrides(base, m)) for m in methods]


def verify(spec: dict[str, Any], runs: list[Any]) -> list[RunCheck]:
    """`check_runs` on one seed of every (method, grid point); ValueError listing every
    undeclared difference (run, field, value, base value)."""
    first = spec["seeds"][0]
    checks = check_runs(spec, [r for r in runs if r.overrides["seed"] == first])
    bad = [f"{c.run}: {k} = {c.diff[k][0]!r} (base {c.diff[k][1]!r})"
           for c in checks for k in c.violations]
    if bad:
        raise ValueError("comparison spec lets fields differ that no method declares:\n  "
                         + "\n  ".join(bad))
    return checks
