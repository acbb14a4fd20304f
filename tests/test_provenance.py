"""A study's runs come from a commit on main: a dirty tree is refused naming the fix or its
diff is written beside the runs; a commit main does not contain is refused."""

import subprocess

import pytest

from experiments.multirun.provenance import check_tree


def _git(repo, *args):
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=repo,
                   check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path):
    r = tmp_path / "repo"
    r.mkdir()
    _git(r, "init", "-q", "-b", "main")
    (r / "a.py").write_text("x = 1\n")
    _git(r, "add", "a.py")
    _git(r, "commit", "-qm", "one")
    return r


def test_a_clean_commit_on_main_starts(repo, tmp_path):
    assert check_tree(tmp_path / "out", "test", cwd=repo) is None
    assert not (tmp_path / "out").exists()


def test_uncommitted_changes_are_refused_or_recorded(repo, tmp_path):
    (repo / "a.py").write_text("x = 2\n")
    with pytest.raises(ValueError, match=r"uncommitted changes \(a.py\): commit them before the "
                                         r"tune stage, or pass --record-diff"):
        check_tree(tmp_path / "out", "tune", cwd=repo)
    path = check_tree(tmp_path / "out", "tune", record_diff=True, cwd=repo)
    text = path.read_text()
    assert path.parent == tmp_path / "out" and path.name.startswith("uncommitted-tune-")
    assert "-x = 1\n+x = 2\n" in text and text.startswith("# uncommitted changes on top of ")


def test_a_commit_main_does_not_hold_is_refused(repo, tmp_path):
    _git(repo, "checkout", "-qb", "side")
    (repo / "a.py").write_text("x = 3\n")
    _git(repo, "commit", "-qam", "side")
    with pytest.raises(ValueError, match="is not in the history of main: merge this branch"):
        check_tree(tmp_path / "out", "test", record_diff=True, cwd=repo)
    _git(repo, "checkout", "-q", "main")
    _git(repo, "merge", "-q", "side")
    assert check_tree(tmp_path / "out", "test", cwd=repo) is None


def test_outside_a_checkout_there_is_nothing_to_check(tmp_path):
    assert check_tree(tmp_path / "out", "test", cwd=tmp_path) is None
