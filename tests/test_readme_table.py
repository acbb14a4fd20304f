"""README's quickstart table is written by experiments.readme_table from a finished run,
carries its commit, machine and config hash, and matches the current quickstart preset."""

import json
import pathlib
import re

import pytest

from experiments import readme_table as rt
from experiments.run.configs import QUICKSTART

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def fake_run(tmp_path, commit=COMMIT, finished=True, **config_changes):
    run = tmp_path / "run"
    run.mkdir(parents=True)
    config = json.loads(QUICKSTART.to_json())
    config.update(config_changes)
    (run / "config.json").write_text(json.dumps(config))
    (run / "meta.json").write_text(json.dumps(
        {"git_commit": commit, "machine": {"cpu": "Test CPU @ 2.0GHz", "cores": 2}}))
    if finished:
        (run / "summary.json").write_text(json.dumps({
            "primary_benchmark": "arithmetic",
            "eval_accuracy_before": 0.33654, "eval_accuracy_after": 0.44049,
            "eval_greedy_before": 0.40523, "eval_greedy_after": 0.51634,
            "eval_pass@4_before": 0.57516, "eval_pass@4_after": 0.62092,
            "reward_first": 0.53151, "final_reward": 0.68359,
            "evals": {"before_rl": {"arithmetic": {"num_examples": 153}}},
        }))
        (run / "eval").mkdir()
        for phase, counts in (("before_rl", [0, 1, 2, 4]), ("after_rl", [1, 1, 4, 4])):
            (run / "eval" / f"{phase}_examples.json").write_text(json.dumps(
                {"phase": phase, "benchmarks": {"arithmetic": {"sampled_correct": counts,
                                                                "greedy": [0, 1, 1, 1]}}}))
    return run


def test_table_from_a_run_renders_the_numbers_and_provenance(tmp_path):
    data = rt.table_data(fake_run(tmp_path))
    assert data["commit"] == COMMIT and data["k"] == 4
    assert data["config_sha256"] == rt.config_sha256(json.loads(QUICKSTART.to_json()))
    assert rt.render(data) == (
        "| | before RL | after RL |\n"
        "|---|---|---|\n"
        "| eval avg@4 (sampled, T=1) | 0.337 | 0.440 |\n"
        "| eval greedy | 0.405 | 0.516 |\n"
        "| eval pass@4 | 0.575 | 0.621 |\n"
        "| training reward (mean of first / last 10 steps) | 0.532 | 0.684 |\n"
        "\n"
        "RL's gain in eval avg@4, paired over the 4 held-out examples: +0.188, 95% t interval "
        "[-0.193, +0.568] (standard error 0.120; one run: RL's spread over seeds is not in "
        "it).\n"
        "\n"
        "Held-out examples: 153, so each accuracy has a binomial standard error of at most "
        "0.040 (sqrt(p(1-p)/153) at p = 0.5; avg@4 no more): differences of a few hundredths "
        f"are noise. Commit `0123456789ab`, config sha256 `{data['config_sha256'][:12]}`, on "
        "Test CPU @ 2.0GHz (2 cores); written by "
        "`python -m experiments.readme_table runs/quickstart --write`.\n")
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{rt.BEGIN}\nold\n-->\nstale | table\n{rt.END}\noutro\n")
    rt.write(readme, data)
    text = readme.read_text()
    assert text.startswith("intro\n<!-- quickstart-table\n{") and text.endswith(f"{rt.END}\noutro\n")
    assert rt.find_block(text) == (data, rt.render(data))


def test_the_command_prints_and_rewrites_only_with_write(tmp_path, capsys):
    """README's footer command used to rewrite README.md in place whenever it was run."""
    run = fake_run(tmp_path)
    readme = tmp_path / "README.md"
    original = f"intro\n{rt.BEGIN}\nold\n-->\nstale | table\n{rt.END}\noutro\n"
    readme.write_text(original)
    assert rt.main([str(run), "--readme", str(readme)]) == 0
    out, err = capsys.readouterr()
    data = rt.table_data(run)
    assert out == rt.block(data) + "\n" and readme.read_text() == original
    assert err == f"readme_table: printed only; --write rewrites the block in {readme}\n"
    assert rt.main([str(run), "--readme", str(readme), "--write"]) == 0
    assert rt.find_block(readme.read_text()) == (data, rt.render(data))
    assert capsys.readouterr().err == f"readme_table: rewrote the block in {readme}\n"
    assert rt.COMMAND.endswith(" --write")  # the README footer names the writing command


def test_gain_is_the_paired_per_example_difference_with_a_t_interval(tmp_path):
    # differences (after - before) / 4 = [0.25, 0, 0.5, 0]: mean 0.1875, sample sd
    # sqrt(0.171875 / 3) = 0.239357, se 0.119678, t_{0.975, 3} = 3.182446, half 0.380870
    gain = rt.table_data(fake_run(tmp_path))["gain"]
    assert gain["n"] == 4 and gain["mean"] == 0.1875
    assert gain["se"] == pytest.approx(0.1196784, abs=1e-7)
    assert (gain["low"], gain["high"]) == pytest.approx((0.1875 - 0.3808700,
                                                         0.1875 + 0.3808700), abs=1e-7)


def test_run_without_per_example_evaluations_is_refused(tmp_path):
    run = fake_run(tmp_path)
    (run / "eval" / "after_rl_examples.json").unlink()
    with pytest.raises(ValueError, match=r"eval/after_rl_examples.json is missing: the table "
                       "pairs each held-out example before and after RL; rerun the quickstart"):
        rt.table_data(run)


def test_dirty_or_unfinished_runs_are_refused(tmp_path):
    with pytest.raises(ValueError, match="commit '.*-dirty': run the quickstart on a clean checkout"):
        rt.table_data(fake_run(tmp_path, commit=COMMIT + "-dirty"))
    with pytest.raises(ValueError, match="has no summary.json: not a finished run"):
        rt.table_data(fake_run(tmp_path / "x", finished=False))


def test_config_hash_ignores_where_files_go_but_not_the_experiment():
    base = json.loads(QUICKSTART.to_json())
    h = rt.config_sha256(base)
    assert rt.config_sha256(dict(base, run_dir="runs/elsewhere", name="x")) == h
    assert rt.config_sha256(dict(base, checkpoint=dict(base["checkpoint"], keep=9))) == h
    assert rt.config_sha256(dict(base, objective=dict(base["objective"], name="grpo"))) != h
    assert rt.config_sha256(dict(base, rl_steps=151)) != h
    # a result-neutral section, even one added after a run (its config lacks it), is not
    # hashed: e.g. the SGLang fleet's timeouts, or where W&B logs
    older = dict(base, sampler={k: v for k, v in base["sampler"].items() if k != "fleet"})
    assert rt.config_sha256(older) == h
    # a field added after a run counts with the default the run had (with_field_defaults)
    older = dict(base, sampler={k: v for k, v in base["sampler"].items() if k != "weight_quant"})
    assert rt.config_sha256(older) == h
    assert rt.config_sha256(dict(base, sampler=dict(base["sampler"], weight_quant="int8"))) != h
    assert rt.config_sha256(dict(base, logging=dict(base["logging"], wandb=True))) == h


def test_readme_quickstart_table_is_generated_and_current():
    """Fails when the table was edited by hand, or the quickstart preset changed since the
    run that produced it: re-run `entr-run quickstart` on a clean checkout, then
    `python -m experiments.readme_table runs/quickstart`."""
    found = rt.find_block(README.read_text())
    assert found is not None, f"README.md has no {rt.BEGIN} ... {rt.END} block"
    data, body = found
    assert body == rt.render(data), "the README table was edited by hand"
    assert re.fullmatch(r"[0-9a-f]{40}", data["commit"]), data["commit"]
    assert data["config_sha256"] == rt.config_sha256(json.loads(QUICKSTART.to_json())), (
        "the quickstart preset changed since the README table was produced")


def test_the_quickstart_time_in_readme_is_of_the_tables_run():
    """README states the quickstart's wall time for the commit whose run made the table:
    a time from another commit (or a table regenerated without its time) fails here."""
    text = README.read_text(encoding="utf-8")
    table = json.loads(text.split("<!-- quickstart-table", 1)[1].split("-->", 1)[0])
    prose = " ".join(text.split("<!-- quickstart-table", 1)[0].split())
    timed = re.search(r"It took \*\*\d+ min \d+ s\*\* on an otherwise idle .*?\(the table's "
                      r"run, commit ([0-9a-f]{7,40}),", prose)
    assert timed, "README's quickstart paragraph lost its measured time"
    assert table["commit"].startswith(timed.group(1))
