"""The fair comparison protocol (experiments.multirun.comparison): every comparison spec in
experiments/sweeps resolves to runs that differ from their shared base only in the fields
each method declares; undeclared differences are refused; the report lists the rest."""

import json
import pathlib

import pytest

from experiments.multirun import comparison, sweep

SWEEPS = pathlib.Path(__file__).resolve().parents[1] / "experiments" / "sweeps"
COMPARISON_SPECS = sorted(p for p in SWEEPS.glob("*.toml") if "[comparison]" in p.read_text())

SPEC = """
preset = "stress"
seeds = [0, 1]
[comparison]
base = { aggregation = "token_mean", l_norm = "None", clip_low = 0.2, clip_high = 0.28 }
[comparison.methods.entr]
objective = "entr"
own = { tau = 0.5, eps = 0.01, entropy_source = "behavior_full", denominator = "all_tokens" }
[comparison.methods.grpo]
objective = "grpo"
own = { kl_coef = 0.0 }
[comparison.methods.grpo_sync]
objective = "grpo"
own = { kl_coef = 0.0 }
overrides = { "staleness.mode" = "sync" }
[comparison.methods.m2po]
objective = "m2po"
own = { tau = 0.04 }
[[grid]]
"optim.learning_rate" = [1e-4, 3e-4]
[fixed]
rl_steps = 5
"""


def _spec(tmp_path, text=SPEC):
    path = tmp_path / "spec.toml"
    path.write_text(text)
    return sweep.load_spec(path)


def test_at_least_one_comparison_spec_is_shipped():
    assert {p.name for p in COMPARISON_SPECS} >= {"stress_methods.toml", "stress_regime.toml"}


@pytest.mark.parametrize("path", COMPARISON_SPECS, ids=lambda p: p.name)
def test_shipped_comparison_specs_differ_only_in_declared_fields(path, tmp_path):
    spec = sweep.load_spec(path)
    runs = sweep.expand(spec, tmp_path)
    checks = comparison.verify(spec, runs)  # raises on any undeclared difference
    base, methods = comparison.parse_methods(spec)
    assert len(checks) == len(runs) // len(spec["seeds"])
    for c in checks:
        method = next(m for m in methods if m.label == c.method)
        assert c.violations == [] and set(c.diff) <= method.allowed(base)
        # the shared fields really are shared: lr, batch, advantages, staleness lag
        for key in ("optim.learning_rate", "task.prompts_per_step", "advantages.estimator",
                    "staleness.inter_lag"):
            assert key not in c.diff, (c.run, key)


def test_stress_methods_spec_declares_exactly_these_differences(tmp_path):
    spec = sweep.load_spec(SWEEPS / "stress_methods.toml")
    checks = {c.method: c for c in comparison.verify(spec, sweep.expand(spec, tmp_path))}
    assert sorted(checks) == sorted(["entr", "icepop", "kpop", "tis", "m2po", "decoupled_ppo",
                                     "gspo", "cispo", "grpo_sync", "grpo_async"])
    # ratio_mode (IcePop/KPop/TIS) is in the base: methods without it show it as n/a
    assert set(checks["grpo_async"].diff) == {"objective.name", "objective.kl_coef",
                                              "objective.ratio_mode"}
    assert checks["grpo_async"].diff["objective.ratio_mode"] == (comparison.MISSING, "bypass")
    assert "objective.ratio_mode" not in checks["icepop"].diff
    assert set(checks["grpo_sync"].diff) == {"objective.name", "objective.kl_coef",
                                             "objective.ratio_mode", "staleness.mode"}
    assert checks["grpo_sync"].diff["staleness.mode"] == ("sync", "simulated")
    assert set(checks["entr"].diff) == {"objective.name", "objective.tau", "objective.eps",
                                        "objective.entropy_source", "objective.denominator",
                                        "objective.ratio_mode"}
    assert checks["m2po"].diff["objective.clip_high"] == (comparison.MISSING, 0.28)
    assert checks["gspo"].diff["objective.clip_low"] == (3e-4, 0.2)


def test_methods_multiply_grid_points_and_seeds(tmp_path):
    spec = _spec(tmp_path)
    runs = sweep.expand(spec, tmp_path / "out")
    assert len(runs) == 2 * 4 * 2
    first = runs[0]
    assert first.name == "method=entr_learning_rate=0.0001_seed=0"
    assert first.overrides == {
        "rl_steps": 5, "name": "entr", "objective.name": "entr",
        "objective.entr.aggregation": "token_mean", "objective.entr.l_norm": None,
        "objective.entr.tau": 0.5, "objective.entr.eps": 0.01,
        "objective.entr.clip_low": 0.2, "objective.entr.clip_high": 0.28,
        "objective.entr.entropy_source": "behavior_full",
        "objective.entr.denominator": "all_tokens",
        "optim.learning_rate": 1e-4, "seed": 0}
    cfg = comparison.resolve("stress", first.overrides)
    assert cfg.objective.entr.tau == 0.5 and cfg.optim.learning_rate == 1e-4 and cfg.rl_steps == 5
    grpo = next(r for r in runs if r.name == "method=grpo_learning_rate=0.0003_seed=1")
    assert grpo.overrides["objective.grpo.aggregation"] == "token_mean"  # base, not GRPO's own
    assert grpo.overrides["objective.grpo.clip_high"] == 0.28


def test_cli_resolution_matches_the_fast_resolution(tmp_path):
    """The command a sweep runs (tyro on the command line) gives the same config as
    `comparison.resolve` for a method with None, float and string overrides."""
    from experiments.run.cli import parse

    spec = _spec(tmp_path)
    run = next(r for r in sweep.expand(spec, tmp_path) if r.name.startswith("method=grpo_sync"))
    argv = run.command(spec["preset"])[3:]
    cli_cfg, _ = parse([a for a in argv if a not in ("--run_dir", str(run.run_dir))])
    assert (comparison.effective_fields(cli_cfg)
            == comparison.effective_fields(comparison.resolve("stress", run.overrides)))


def test_undeclared_difference_from_a_grid_is_refused(tmp_path):
    text = SPEC.replace('"optim.learning_rate" = [1e-4, 3e-4]',
                        '"objective.grpo.clip_high" = [0.2]')
    spec = _spec(tmp_path, text)
    with pytest.raises(ValueError, match=r"objective\.clip_high = 0\.2 \(base 0\.28\)"):
        comparison.verify(spec, sweep.expand(spec, tmp_path))


def test_a_method_own_parameter_wins_over_fixed(tmp_path):
    """[fixed] cannot silently change a method's declared own parameter: the method's
    value is applied after [fixed] and is what the report shows."""
    text = SPEC.replace("rl_steps = 5", 'rl_steps = 5\n"objective.m2po.tau" = 0.1')
    spec = _spec(tmp_path, text)
    checks = comparison.verify(spec, sweep.expand(spec, tmp_path))  # own param: method wins
    assert next(c for c in checks if c.method == "m2po").diff["objective.tau"] == (0.04, comparison.MISSING)


@pytest.mark.parametrize("mutation, message", [
    (("own = { tau = 0.04 }", "own = {}"), r"m2po leaves objective\.m2po field\(s\) \['tau'\] undeclared"),
    (("own = { tau = 0.04 }", "own = { tau = 0.04, phi = 2.0 }"), r"own field\(s\) \['phi'\] are not fields"),
    (('objective = "m2po"', 'objective = "nope"'), r"objective 'nope' is unknown"),
    (("clip_high = 0.28 }", "clip_high = 0.28, bogus = 1 }"), r"base field\(s\) \['bogus'\] exist in no"),
    (('overrides = { "staleness.mode" = "sync" }', 'overrides = { "objective.grpo.clip_low" = 0.1 }'),
     r"overrides key 'objective\.grpo\.clip_low' is not allowed"),
    (('"optim.learning_rate" = [1e-4, 3e-4]', '"staleness.mode" = ["sync"]'), r"also swept by a grid"),
])
def test_bad_comparison_tables_fail_at_load_naming_the_key(tmp_path, mutation, message):
    with pytest.raises(ValueError, match=message):
        _spec(tmp_path, SPEC.replace(*mutation))


def test_summary_reports_differences_from_the_base_per_method(tmp_path, capsys):
    spec = _spec(tmp_path)
    out = tmp_path / "out"
    runs = sweep.expand(spec, out)
    comparison.write_spec(spec, out)
    for r in runs:  # started runs: their config.json is the truth the report reads
        r.run_dir.mkdir(parents=True)
        cfg = comparison.resolve("stress", r.overrides)
        (r.run_dir / "config.json").write_text(cfg.to_json())
        (r.run_dir / "summary.json").write_text(json.dumps({"final_reward": 0.5}))
    sweep.main(["summarize", str(out)])
    text = capsys.readouterr().out
    assert "- grpo_sync:\n    objective.kl_coef = 0.0 (base 'n/a')" in text
    assert "    staleness.mode = 'sync' (base 'simulated')" in text
    assert "- m2po:\n    objective.clip_high = 'n/a' (base 0.28)" in text
    assert "UNDECLARED" not in text
    # a run whose written config drifted from the protocol is flagged
    bad = runs[0].run_dir / "config.json"
    cfg = json.loads(bad.read_text())
    cfg["optim"]["learning_rate"] = 0.5
    bad.write_text(json.dumps(cfg))
    sweep.main(["summarize", str(out)])
    assert "optim.learning_rate = 0.5 (base 0.0001)  UNDECLARED" in capsys.readouterr().out


def test_stored_configs_that_predate_a_field_are_not_a_difference(tmp_path):
    """Runs written before a config field existed (their config.json lacks it) compare on
    the preset's value; a stored value that really differs is still refused."""
    spec = _spec(tmp_path)
    runs = [r for r in sweep.expand(spec, tmp_path / "out")
            if r.overrides["name"] in ("entr", "grpo")]
    stored = {}
    for r in runs:
        config = json.loads(comparison.resolve("stress", r.overrides).to_json())
        del config["sampler"]["min_prompt_bucket"]  # written before the field existed
        stored[r.name] = config
    checks = comparison.check_runs(spec, runs, stored)
    assert all(c.violations == [] for c in checks)
    assert all("sampler.min_prompt_bucket" not in c.diff for c in checks)
    changed = dict(stored)
    name = runs[0].name
    changed[name] = json.loads(json.dumps(stored[name]))
    changed[name]["optim"]["weight_decay"] = 0.5
    bad = {c.run: c.violations for c in comparison.check_runs(spec, runs, changed)}
    assert bad[name] == ["optim.weight_decay"]


@pytest.mark.parametrize("path", COMPARISON_SPECS, ids=lambda p: p.name)
def test_every_compared_method_computes_something_of_its_own(path):
    """A method whose own parameters are inert under the shared base is the reference in
    disguise (TIS in bypass mode, prox := mu, was async GRPO: its weight min(mu/mu, 2) = 1).
    On a stale batch, with the proximal log-probs equal to the current ones (one update
    per rollout batch, as these specs run), every method's loss or gradient differs from
    async GRPO's; only methods declaring run overrides (GRPO sync) may share its objective."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from entr_jax.types import ObjectiveInput
    from experiments.run.objective import build_objective

    spec = sweep.load_spec(path)
    points = dict(comparison.method_points(spec))
    _, methods = comparison.parse_methods(spec)
    rng = np.random.default_rng(0)
    logp_pi = jnp.asarray(-rng.uniform(0.05, 3.0, (4, 16)), jnp.float32)
    logp_mu = logp_pi + jnp.asarray(rng.normal(0.0, 0.7, (4, 16)), jnp.float32)
    entropy_mu = jnp.asarray(rng.uniform(0.05, 3.0, (4, 16)), jnp.float32)
    # one far-off token at near-zero entropy, which a loose gate (ENTR tau 16: S = 4 / 0.011)
    # still cuts: stale batches have them, and without one tau 16 would look inert here
    logp_mu, entropy_mu = logp_mu.at[0, 0].set(logp_pi[0, 0] - 2.0), entropy_mu.at[0, 0].set(0.001)
    batch = ObjectiveInput(
        loss_mask=jnp.ones((4, 16), bool),
        advantages=jnp.asarray(np.repeat([[1.0], [-1.0], [0.5], [-0.5]], 16, axis=1), jnp.float32),
        logp_mu=logp_mu, entropy_mu=entropy_mu,
        logp_prox=logp_pi, num_loss_tokens=jnp.float32(64))

    def value_grad(label):
        f = build_objective(comparison.resolve(spec["preset"], points[f"method={label}"]))
        b = batch if f.batch_stats is None else batch.replace(
            batch_stats=f.batch_stats(logp_pi, batch))
        (loss, _), g = jax.value_and_grad(lambda x: f(x, b), has_aux=True)(logp_pi)
        return float(loss), np.asarray(g)

    if "method=grpo_async" not in points:
        pytest.skip(f"{path.name} compares no async GRPO")
    ref_loss, ref_grad = value_grad("grpo_async")
    compared = []
    for m in methods:
        if m.label == "grpo_async" or m.overrides:
            continue
        loss, grad = value_grad(m.label)
        assert abs(loss - ref_loss) > 1e-6 or np.max(np.abs(grad - ref_grad)) > 1e-6, m.label
        compared.append(m.label)
    assert len(compared) == sum(1 for m in methods if m.label != "grpo_async" and not m.overrides)
