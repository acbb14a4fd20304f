"""Write README.md's quickstart table from a finished quickstart run, with its provenance.

::

    entr-run quickstart                                   # on a clean checkout
    python -m experiments.readme_table runs/quickstart            # prints the block
    python -m experiments.readme_table runs/quickstart --write    # rewrites it in README.md

The block sits between ``<!-- quickstart-table`` and ``<!-- /quickstart-table -->``. Its
opening comment holds the data as JSON (the numbers from ``summary.json``, the commit
and machine from ``meta.json``, and `config_sha256` of the run's ``config.json``); the
Markdown below it is `render` of that data. ``tests/test_readme_table.py`` re-renders
the block and compares (a hand edit fails), and compares the hash with the current
quickstart preset (a preset change without a new run fails), so stale numbers do not
ship. A run from a tree with uncommitted changes (``-dirty`` commit) is refused. Without
``--write`` nothing is written: the command prints the block it would write.

RL's gain is paired per example: ``d_i = avg@k_after(i) - avg@k_before(i)`` over the
held-out examples (``eval/<phase>_examples.json``), its mean with a 95% Student-t interval
``mean +- t_{0.975, n-1} * s / sqrt(n)`` (`experiments.analysis.stats.mean_ci`). The
interval is over the examples of this one run: it leaves out the spread of RL itself
over seeds (a study measures that, `experiments.multirun.study`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import pathlib
import re
import sys
from typing import Any

from scipy import stats as _st

from experiments.analysis.stats import mean_ci
from experiments.run.config import with_field_defaults
from experiments.run.resume import RESULT_NEUTRAL_FIELDS, RESULT_NEUTRAL_SECTIONS

BEGIN = "<!-- quickstart-table"
END = "<!-- /quickstart-table -->"
COMMAND = "python -m experiments.readme_table runs/quickstart --write"
_BLOCK = re.compile(re.escape(BEGIN) + r"\n(?P<data>\{.*?\})\n-->\n(?P<body>.*?)" + re.escape(END),
                    re.S)
REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]


def config_sha256(config: dict[str, Any]) -> str:
    """sha256 of a config dict (``config.json``) in canonical JSON, without the fields that
    cannot change results (`experiments.run.resume.RESULT_NEUTRAL_FIELDS`, e.g. ``run_dir``,
    and the sections `experiments.run.resume.RESULT_NEUTRAL_SECTIONS`, e.g. ``logging``), read
    through `experiments.run.config.with_field_defaults`: a field added after a run counts with
    the default it ran with, so adding one leaves the sha of an older run's config as the
    current preset's when nothing else changed."""
    def strip(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
        out = {}
        for key, value in tree.items():
            name = prefix + key
            if name in RESULT_NEUTRAL_FIELDS or (name + ".").startswith(RESULT_NEUTRAL_SECTIONS):
                continue
            out[key] = strip(value, name + ".") if isinstance(value, dict) else value
        return out

    canonical = json.dumps(strip(with_field_defaults(config)), sort_keys=True,
                           separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def paired_gain(run: pathlib.Path, benchmark: str, k: int) -> dict[str, float]:
    """``{"mean", "low", "high", "se", "n"}`` of the per-example avg@k difference after RL
    minus before RL on ``benchmark`` (module docstring).

    Raises:
      ValueError: a phase's ``eval/<phase>_examples.json`` is missing (a run from before it
        was written) or the two phases hold different examples; the message names the file.
    """
    counts = {}
    for phase in ("before_rl", "after_rl"):
        path = run / "eval" / f"{phase}_examples.json"
        if not path.is_file():
            raise ValueError(f"{path} is missing: the table pairs each held-out example "
                             "before and after RL; rerun the quickstart with this code")
        counts[phase] = json.loads(path.read_text())["benchmarks"][benchmark]["sampled_correct"]
    before, after = counts["before_rl"], counts["after_rl"]
    if len(before) != len(after):
        raise ValueError(f"{run / 'eval'}: before_rl has {len(before)} examples, after_rl "
                         f"{len(after)}: the phases must evaluate the same examples")
    diffs = [(a - b) / k for a, b in zip(after, before)]
    mean, half, n = mean_ci(diffs)
    return {"mean": mean, "low": mean - half, "high": mean + half,
            "se": half / float(_st.t.ppf(0.975, n - 1)), "n": n}


def table_data(run_dir: str | pathlib.Path, allow_dirty: bool = False) -> dict[str, Any]:
    """The block's data from a finished run directory.

    Raises:
      ValueError: the run is unfinished (no summary.json), its commit is unknown or
        ``-dirty`` (unless ``allow_dirty``), or it lacks the per-example evaluations
        (`paired_gain`).
    """
    run = pathlib.Path(run_dir)
    if not (run / "summary.json").is_file():
        raise ValueError(f"{run} has no summary.json: not a finished run")
    summary = json.loads((run / "summary.json").read_text())
    meta = json.loads((run / "meta.json").read_text())
    config = json.loads((run / "config.json").read_text())
    commit = meta.get("git_commit", "unknown")
    if not allow_dirty and (commit == "unknown" or commit.endswith("-dirty")):
        raise ValueError(f"{run}/meta.json: commit {commit!r}: run the quickstart on a clean "
                         "checkout so the table names the code that produced it")
    k = config["task"]["eval_samples"]
    machine = meta.get("machine") or {}
    return {
        "commit": commit,
        "config_sha256": config_sha256(config),
        "machine": {"cpu": machine.get("cpu", "unknown"), "cores": machine.get("cores")},
        "k": k,
        "temperature": config["sampling"]["temperature"],
        "eval_examples": summary["evals"]["before_rl"][summary["primary_benchmark"]]["num_examples"],
        "gain": paired_gain(run, summary["primary_benchmark"], k),
        "before": [summary["eval_accuracy_before"], summary["eval_greedy_before"],
                   summary[f"eval_pass@{k}_before"], summary["reward_first"]],
        "after": [summary["eval_accuracy_after"], summary["eval_greedy_after"],
                  summary[f"eval_pass@{k}_after"], summary["final_reward"]],
    }


def render(data: dict[str, Any]) -> str:
    """The Markdown of the block's data (three decimals), with the noise of one accuracy:
    the largest binomial standard error over ``n`` held-out examples, ``sqrt(0.25 / n)``
    (one draw per example, as greedy; avg@k averages k draws per example, so its error is
    no larger)."""
    k, t = data["k"], data["temperature"]
    labels = [f"eval avg@{k} (sampled, T={t:g})", "eval greedy", f"eval pass@{k}",
              "training reward (mean of first / last 10 steps)"]
    lines = ["| | before RL | after RL |", "|---|---|---|"]
    lines += [f"| {label} | {b:.3f} | {a:.3f} |"
              for label, b, a in zip(labels, data["before"], data["after"])]
    g = data["gain"]
    lines += ["", f"RL's gain in eval avg@{k}, paired over the {g['n']} held-out examples: "
              f"{g['mean']:+.3f}, 95% t interval [{g['low']:+.3f}, {g['high']:+.3f}] "
              f"(standard error {g['se']:.3f}; one run: RL's spread over seeds is not in it)."]
    m = data["machine"]
    n = data["eval_examples"]
    lines += ["", f"Held-out examples: {n}, so each accuracy has a binomial standard error of "
              f"at most {math.sqrt(0.25 / n):.3f} (sqrt(p(1-p)/{n}) at p = 0.5; avg@{k} no "
              "more): differences of a few hundredths are noise. "
              f"Commit `{data['commit'][:12]}`, "
              f"config sha256 `{data['config_sha256'][:12]}`, on {m['cpu']} "
              f"({m['cores']} cores); written by `{COMMAND}`."]
    return "\n".join(lines) + "\n"


def block(data: dict[str, Any]) -> str:
    return f"{BEGIN}\n{json.dumps(data, sort_keys=True)}\n-->\n{render(data)}{END}"


def find_block(readme_text: str) -> tuple[dict[str, Any], str] | None:
    """``(data, body)`` of the README's block, or None when it has none."""
    match = _BLOCK.search(readme_text)
    if match is None:
        return None
    return json.loads(match["data"]), match["body"]


def write(readme: str | pathlib.Path, data: dict[str, Any]) -> None:
    """Replace the block in ``readme`` (it must have one: the begin/end markers)."""
    path = pathlib.Path(readme)
    text = path.read_text()
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{path} has no {BEGIN} ... {END} block to replace")
    path.write_text(text[:start] + block(data) + text[end + len(END):])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.readme_table",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir")
    parser.add_argument("--readme", default=str(REPO_ROOT / "README.md"))
    parser.add_argument("--allow-dirty", action="store_true",
                        help="accept a run from a tree with uncommitted changes")
    parser.add_argument("--write", action="store_true",
                        help="rewrite the block in --readme (default: only print it)")
    args = parser.parse_args(argv)
    try:
        data = table_data(args.run_dir, allow_dirty=args.allow_dirty)
        if args.write:
            write(args.readme, data)
    except (ValueError, OSError) as e:
        print(f"readme_table: error: {e}", file=sys.stderr)
        return 2
    print(block(data))
    done = "rewrote the block in" if args.write else "printed only; --write rewrites the block in"
    print(f"readme_table: {done} {args.readme}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
