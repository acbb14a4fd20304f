"""Provenance of a study's runs: every run must come from a commit a reader can check out.

A pre-registered study (`experiments.study`) refuses to start runs from a working tree with
uncommitted changes to tracked files, or from a commit that is not in the history of the
``main`` branch (a branch nobody merged leaves runs whose code is gone: the fp8 study's
``5440102`` and ``0a74923``, `results/stress_fp8/PROVENANCE.md`). ``--record-diff``
starts them anyway and writes the uncommitted diff beside the runs
(``OUT/uncommitted-<stage>-<UTC time>.diff``, with the commit it applies to), so the code
behind every run can still be rebuilt.
"""

from __future__ import annotations

import datetime
import pathlib
import subprocess

MAIN = "main"


def _git(args: list[str], cwd: str | pathlib.Path | None) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=30)


def check_tree(out: str | pathlib.Path, stage: str, record_diff: bool = False,
               cwd: str | pathlib.Path | None = None) -> pathlib.Path | None:
    """Refuse (ValueError naming the fix) to start a stage's runs from a tree with
    uncommitted changes to tracked files, unless ``record_diff``, which writes the diff to
    ``out`` and returns its path; refuse a ``HEAD`` that a ``main`` branch exists beside and
    does not contain. Outside a git checkout (an installed package) there is nothing to
    check: returns None."""
    head = _git(["rev-parse", "HEAD"], cwd)
    if head.returncode != 0:
        return None
    commit = head.stdout.strip()
    has_main = _git(["rev-parse", "--verify", "--quiet", MAIN], cwd).returncode == 0
    if has_main and _git(["merge-base", "--is-ancestor", commit, MAIN], cwd).returncode != 0:
        raise ValueError(f"HEAD {commit[:12]} is not in the history of {MAIN}: merge this "
                         f"branch into {MAIN} and run the {stage} stage from there, so every "
                         "run records a commit a reader can check out")
    diff = _git(["diff", "HEAD"], cwd).stdout
    if not diff:
        return None
    if not record_diff:
        changed = _git(["diff", "--name-only", "HEAD"], cwd).stdout.split()
        raise ValueError(f"the working tree has uncommitted changes ({', '.join(changed[:5])}"
                         f"{' ...' if len(changed) > 5 else ''}): commit them before the "
                         f"{stage} stage, or pass --record-diff to write the diff beside the runs")
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = pathlib.Path(out) / f"uncommitted-{stage}-{stamp}.diff"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# uncommitted changes on top of {commit}, when the {stage} stage "
                    f"started\n{diff}")
    return path
