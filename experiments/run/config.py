"""The run configuration: frozen, typed dataclasses, one per concern.

Every field is overridable from the command line through ``tyro`` with its dotted name
(``--staleness.inter_lag 5``, ``--objective.name grpo``, ``--objective.entr.tau 0.5``);
validation happens when a config is built and errors name the field.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import re
from typing import Any, Literal

from entr_jax.advantages import AdvantageConfig
from entr_jax.objectives import ALIASES, OBJECTIVES
from entr_jax.staleness import StalenessConfig
from learners.logging import LoggingConfig
from entr_jax.tasks.rewards import VerifierConfig
from experiments.run.errors import ConfigError
from learners.contract import check_reference_filters
from learners.optim import OptimizerConfig
from experiments.run.sampler_specs import (  # noqa: F401  (re-exported with the run's config)
    MIN_TEMPERATURE,
    FleetSpec,
    SamplerSpec,
    SamplingSpec,
)
from experiments.run.specs import (  # noqa: F401  (the sections, re-exported with the run's config)
    CheckpointSpec,
    DataSpec,
    LearnerSpec,
    ModelSpec,
    SFTSpec,
    TaskSpec,
    require,
)



def variant_rules(cls: type, prefix: str = "") -> dict[str, tuple[str, tuple[str, ...]]]:
    """Which variant each field of a config belongs to, read from the types: a section
    whose class names a ``VARIANT_FIELD`` (``staleness.mode``, ``sampler.kind``,
    ``task.name``) owns the fields that declare ``metadata["variants"]``
    (`experiments.run.specs.variant`; a nested section's key ends in "."); the objective
    sections belong to their registry name (and its aliases). Returns ``{field: (selecting
    field, the values that read it)}``."""
    rules: dict[str, tuple[str, tuple[str, ...]]] = {}
    for f in dataclasses.fields(cls):
        sub = f.type if isinstance(f.type, type) else type(f.default)
        if not dataclasses.is_dataclass(sub):
            continue
        section = prefix + f.name
        selector = getattr(sub, "VARIANT_FIELD", None)
        if selector is not None:
            for g in dataclasses.fields(sub):
                if "variants" in g.metadata:
                    nested = dataclasses.is_dataclass(g.default)
                    rules[f"{section}.{g.name}" + ("." if nested else "")] = (
                        f"{section}.{selector}", tuple(g.metadata["variants"]))
    return rules


def _objective_rules() -> dict[str, tuple[str, tuple[str, ...]]]:
    """``objective.<name>.`` belongs to ``objective.name=<name>`` and its aliases."""
    return {f"objective.{name}.": ("objective.name", (name,) + tuple(sorted(
        alias for alias, target in ALIASES.items() if target == name)))
        for name in OBJECTIVES if name not in ALIASES}


def selector_of(field: str) -> tuple[str, tuple[str, ...]] | None:
    """``(selecting field, values that read it)`` of a dotted field (`SELECTED_FIELDS`), or
    None for a field every run reads."""
    for key, rule in SELECTED_FIELDS.items():
        if field == key or (key.endswith(".") and field.startswith(key)):
            return rule
    return None


def dotted(cfg: Any, field: str) -> Any:
    """The value of a dotted field (``"staleness.mode"``) of a config."""
    for part in field.split("."):
        cfg = getattr(cfg, part)
    return cfg


def _check_numbers(cfg: Any, prefix: str = "") -> None:
    """Refuse, naming the field, what no field of a run can mean: a NaN anywhere, an
    infinite value outside the objective sections (whose ranges say where ``inf`` is
    meant, e.g. no upper clip), a seed (``seed``, ``*_seed``) outside ``[0, 2**32)``,
    and any other integer outside ``[-2**63, 2**63)``, which numpy and JAX refuse (or
    loop over) only when the run reaches them."""
    for f in dataclasses.fields(cfg):
        value, name = getattr(cfg, f.name), prefix + f.name
        if dataclasses.is_dataclass(value):
            _check_numbers(value, name + ".")
        elif isinstance(value, float) and not math.isfinite(value) and (
                math.isnan(value) or not name.startswith("objective.")):
            raise ValueError(f"{name} must be a finite number, got {value!r}")
        elif (f.name == "seed" or f.name.endswith("_seed")) and isinstance(value, int) \
                and not 0 <= value < 2**32:
            raise ValueError(f"{name} must be in [0, 2**32), got {value!r}")
        elif isinstance(value, int) and not isinstance(value, bool) \
                and not -2**63 <= value < 2**63:
            raise ValueError(f"{name} must be a 64-bit integer (in [-2**63, 2**63)), got "
                             f"{value!r}")


# the registry's names as a Literal, so ``--help`` lists them and tyro refuses others
ObjectiveName = Literal[tuple(sorted(OBJECTIVES))]  # type: ignore[valid-type]


def run_section(cls: type, prefix: str) -> type:
    """``cls`` as a section of the run: the same frozen dataclass (fields, defaults,
    documentation, checks), whose errors name a field as the command line spells it
    (``optim.learning_rate must be > 0``), not as the library class does
    (``OptimizerConfig.learning_rate``)."""
    check = cls.__post_init__
    own = re.compile(rf"(?<![\w.]){re.escape(cls.__name__)}\.(?=\w)")

    def __post_init__(self):
        try:
            check(self)
        except ValueError as err:
            raise ValueError(own.sub(prefix, str(err))) from None

    section = type(cls.__name__, (cls,), {"__post_init__": __post_init__, "__doc__": cls.__doc__,
                                          "__module__": cls.__module__,
                                          "__qualname__": cls.__qualname__})
    return dataclasses.dataclass(frozen=True)(section)


def as_section(value: Any, section: type) -> Any:
    """``value`` (an instance of the library class, e.g. a preset's
    ``OptimizerConfig(...)``) as the run's `run_section` of it, field for field."""
    if type(value) is section:
        return value
    return section(**{f.name: getattr(value, f.name) for f in dataclasses.fields(section)})


_OptimBase = run_section(OptimizerConfig, "optim.")


@dataclasses.dataclass(frozen=True)
class OptimSection(_OptimBase):
    __doc__ = OptimizerConfig.__doc__  # the --help text; total_steps 0: `rl_optimizer`

    def __post_init__(self):
        if self.schedule == "cosine" and self.total_steps == 0:
            # derived by RunConfig from the run's length; the other fields are checked here
            dataclasses.replace(self, total_steps=self.warmup_steps + 1)
            return
        super().__post_init__()


def rl_optimizer(optim: OptimSection, updates: int) -> OptimSection:
    """``optim`` with a cosine schedule's length derived from the run's ``updates`` when
    ``optim.total_steps`` is 0 (unchanged otherwise). ValueError names the fields when the
    run is too short for its warmup."""
    if optim.schedule != "cosine" or optim.total_steps:
        return optim
    if updates == 0:  # no RL step: no schedule is run; the shortest valid one is recorded
        return dataclasses.replace(optim, total_steps=optim.warmup_steps + 1)
    require(updates > optim.warmup_steps, "optim.warmup_steps", optim.warmup_steps,
            f"< the run's {updates} optimizer updates (rl_steps * learner.minibatches * "
            "learner.epochs), the cosine schedule's length with optim.total_steps 0; lower "
            "it or set optim.total_steps")
    return dataclasses.replace(optim, total_steps=updates)


def _objective_spec_class() -> type:
    sections: dict[str, type] = {}
    fields: list[tuple[str, Any, Any]] = [
        ("name", ObjectiveName, dataclasses.field(default="entr")),
    ]
    for name, (_, cfg_cls) in OBJECTIVES.items():
        if name in ALIASES:
            continue
        section = sections[name] = run_section(cfg_cls, f"objective.{name}.")
        fields.append((name, section, dataclasses.field(default=section())))

    def __post_init__(self):
        for name, section in sections.items():  # a preset's library instances
            object.__setattr__(self, name, as_section(getattr(self, name), section))
        if self.name not in OBJECTIVES:
            raise ValueError(
                f"objective.name {self.name!r} is unknown; known objectives: {sorted(OBJECTIVES)}"
            )

    def selected(self):
        """The config of the selected objective."""
        return getattr(self, ALIASES.get(self.name, self.name))

    cls = dataclasses.make_dataclass(
        "ObjectiveSpec", fields, frozen=True,
        namespace={"__post_init__": __post_init__, "selected": selected},
    )
    cls.__doc__ = (
        "The objective: ``name`` selects one of the registry's methods; every method's "
        "hyperparameters are its own typed section (``objective.<name>.<field>``).\n\n"
        "Attributes:\n"
        "  name: the method (`entr_jax.objectives.OBJECTIVES`; ``estr`` is the paper's "
        "name for ``entr`` and reads ``objective.entr``).\n"
    )
    cls.__module__ = __name__
    return cls


ObjectiveSpec = _objective_spec_class()


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """One training run.

    Attributes:
      name: run name (also the default run directory ``runs/<name>``).
      run_dir: where everything is written; empty = ``runs/<name>``.
      shared_eval_dir: a directory shared by runs (a sweep's ``<out>/shared_eval``) where
        the evaluation of the starting weights is stored once per key and read by every
        later run with that key instead of evaluating again (`experiments.run.shared_eval`:
        the key holds every field the evaluation reads and the warm start's bytes);
        empty = every run evaluates its own. Changes no value a run writes.
      seed: master seed (data order, sampling, initialisation of the tiny model).
      rl_steps: rollout batches RL trains on (each gives ``learner.minibatches *
        learner.epochs`` optimizer updates and one new policy version).
      token_samples_every: store per-token (delta, entropy_mu) samples for the analysis
        notebooks every this many steps (0 = never; >= 0).
      objective: the loss. ``--objective.name`` selects the method (a registry name);
        every method's hyperparameters are their own section ``--objective.<name>.<field>``.
    """

    name: str = "run"
    run_dir: str = ""
    shared_eval_dir: str = ""
    seed: int = 0
    rl_steps: int = 100
    token_samples_every: int = 10
    model: ModelSpec = ModelSpec()
    sampler: SamplerSpec = SamplerSpec()
    task: TaskSpec = TaskSpec()
    data: DataSpec = DataSpec()
    sampling: SamplingSpec = SamplingSpec()
    advantages: AdvantageConfig = AdvantageConfig()
    objective: ObjectiveSpec = ObjectiveSpec()
    optim: OptimSection = OptimSection(learning_rate=1e-4)
    sft: SFTSpec = SFTSpec()
    learner: LearnerSpec = LearnerSpec()
    staleness: StalenessConfig = StalenessConfig()
    checkpoint: CheckpointSpec = CheckpointSpec()
    logging: LoggingConfig = LoggingConfig()
    verifier: VerifierConfig = VerifierConfig()  # answer checking: workers, time limit

    def __post_init__(self):
        object.__setattr__(self, "optim", rl_optimizer(
            as_section(self.optim, OptimSection),
            self.rl_steps * self.learner.minibatches * self.learner.epochs))
        _check_numbers(self)
        parts = self.name.replace("\\", "/").split("/")
        require(bool(self.name.strip()) and not os.path.isabs(self.name)
                 and not {".", ".."} & set(parts) and "" not in parts, "name", self.name,
                 "a non-empty run name inside runs/ (no leading '/', no empty, '.' or '..' "
                 "part): the run directory is runs/<name> unless --run_dir is given")
        require(self.rl_steps >= 0, "rl_steps", self.rl_steps, ">= 0")
        rows = self.task.prompts_per_step * self.task.samples_per_prompt
        require(self.learner.minibatches <= rows, "learner.minibatches", self.learner.minibatches,
                 f"<= the rollout batch's {rows} rows (task.prompts_per_step * task.samples_per_prompt)")
        require(self.token_samples_every >= 0, "token_samples_every", self.token_samples_every,
                 ">= 0 (0 = never)")
        require(self.task.samples_per_prompt >= 2, "task.samples_per_prompt",
                 self.task.samples_per_prompt,
                 f">= 2 with advantages.estimator={self.advantages.estimator!r}: the "
                 "advantage is relative to the prompt's group, so a group of one gets "
                 "advantage 0 and nothing is trained")
        require(
            not (self.sampler.kind == "sglang" and self.staleness.mode == "simulated"
                 and self.staleness.intra_switches > 0),
            "staleness.intra_switches", self.staleness.intra_switches,
            "0 with sampler.kind='sglang' (SGLang cannot replay simulated switches; use "
            "staleness.mode=async for real in-flight updates)",
        )
        st = self.staleness
        require(st.mode != "simulated" or st.intra_switches == 0
                 or st.switch_window <= self.task.max_new_tokens,
                 "staleness.switch_window", st.switch_window,
                 f"<= task.max_new_tokens ({self.task.max_new_tokens}) with intra switches: a "
                 "switch at a decode step no response reaches can never happen")
        if self.sampler.kind == "sglang":
            for name, off in (("top_p", 1.0), ("top_k", -1), ("min_p", 0.0)):
                require(getattr(self.sampling, name) == off, f"sampling.{name}",
                         getattr(self.sampling, name),
                         f"{off} (off) with sampler.kind='sglang': SGLang returns log-probs of "
                         "the tempered distribution before top-k/top-p/min-p, so the learner "
                         "could not score the distribution the tokens were drawn from")
        # A KL penalty to the reference (GRPO's k3, DeepSeekMath eq. 4) is between the
        # policies; under sampling filters it is a clipped constant where the policy left
        # the reference's support (learners.contract.check_reference_filters).
        section = ALIASES.get(self.objective.name, self.objective.name)
        coef = getattr(self.objective.selected(), "kl_coef", None)
        check_reference_filters(
            self.objective.selected().inputs(),
            {name: getattr(self.sampling, name) for name in ("top_p", "top_k", "min_p")},
            kl=(f"--objective.{section}.kl_coef {coef}" if coef is not None
                else f"objective.{section}"),
            kl_off=f"--objective.{section}.kl_coef 0",
            field=lambda name, value: f"--sampling.{name} {value}")
        # ENTR's entropy source must name what the sampler provides: the embedded sampler
        # reports the exact entropy of mu, the SGLang fleet a top-k estimate where the engine
        # does not report it (docs/sglang.md section 4).
        source = getattr(self.objective.selected(), "entropy_source", None)
        if source is not None and source != "current_full":
            need = "behavior_topk" if self.sampler.kind == "sglang" else "behavior_full"
            require(source == need, f"objective.{section}.entropy_source", source,
                     f"{need!r} or 'current_full' with sampler.kind={self.sampler.kind!r}")

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True, default=str)

    def with_saved(self, saved: dict[str, Any]) -> "RunConfig":
        """This config with the values of a saved ``config.json`` (`to_json`'s dict): the
        run's own configuration, rebuilt on this config's typed structure (nested sections
        recursively, JSON lists back to tuples); fields the file lacks (added since) take
        their defaults (`with_field_defaults`), which is what the run ran with. Validation
        runs again.

        Raises:
          ConfigError: a saved field this version does not have (named, dotted).
        """
        return _with_saved(self, with_field_defaults(saved), "")


def with_field_defaults(saved: dict[str, Any]) -> dict[str, Any]:
    """A saved ``config.json`` dict completed with the defaults of the fields it lacks.

    A run whose ``config.json`` predates a field ran with the behaviour that field's
    default keeps (a field is added with the default that reproduces the code before it),
    so every comparison of a stored config with a current one (resume, sweep reuse,
    comparison checks) reads it through this function: the field then shows as a
    difference only when the new value is not its default. Fields this version does not
    know are kept (they stay a difference). The input is not modified.
    """
    def fill(tree: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
        out = dict(tree)
        for key, value in defaults.items():
            if key not in out:
                out[key] = value
            elif isinstance(value, dict) and isinstance(out[key], dict):
                out[key] = fill(out[key], value)
        return out

    return fill(saved, json.loads(_default_json()))


@functools.lru_cache(maxsize=1)
def _default_json() -> str:
    return RunConfig().to_json()


def _with_saved(current: Any, saved: dict[str, Any], prefix: str) -> Any:
    names = {f.name for f in dataclasses.fields(current)}
    unknown = sorted(set(saved) - names)
    if unknown:
        raise ConfigError("the saved config.json has field(s) this version does not know: "
                          + ", ".join(prefix + k for k in unknown))
    changes = {}
    for name, value in saved.items():
        now = getattr(current, name)
        if dataclasses.is_dataclass(now) and isinstance(value, dict):
            changes[name] = _with_saved(now, value, f"{prefix}{name}.")
        elif isinstance(now, tuple) and isinstance(value, list):
            changes[name] = tuple(value)
        else:
            changes[name] = value
    return dataclasses.replace(current, **changes)


# Fields that only some values of a selecting field read (a key ending in "." is a whole
# section), derived from the types (`variant_rules`). A field given on the command line
# for a selection that does not read it is refused (`experiments.run.cli`); a preset's
# value for it is kept in config.json but has no effect (the CLI notes it).
SELECTED_FIELDS: dict[str, tuple[str, tuple[str, ...]]] = {
    **variant_rules(RunConfig), **_objective_rules()}
