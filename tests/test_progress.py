"""Progress bars written to a log (not a terminal) refresh at most every LOG_INTERVAL_S
seconds: a 2000-step warm start written to a sweep's run log was 2000 redraws."""

import io
import re

from experiments import progress


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_bar_in_a_log_refreshes_rarely_and_on_a_terminal_often(monkeypatch):
    clock = iter(range(10**6))  # each reading of tqdm's clock 1 s after the one before
    monkeypatch.setattr("tqdm.std.time", lambda: float(next(clock)))
    log = io.StringIO()
    for _ in progress.progress_bar(range(100), desc="SFT", file=log):
        pass
    draws = log.getvalue().split("\r")[1:]
    minutes, seconds = re.search(r"\[(\d+):(\d+)<", draws[-1]).groups()  # its elapsed time
    elapsed = 60 * int(minutes) + int(seconds)
    # the first draw, at most one per 30 s of its clock, and the last one
    assert 2 <= len(draws) <= 2 + elapsed // progress.LOG_INTERVAL_S
    term = Terminal()
    for _ in progress.progress_bar(range(100), desc="SFT", file=term):
        pass
    assert term.getvalue().count("\r") >= 100
    quiet = io.StringIO()
    for _ in progress.progress_bar(range(100), desc="SFT", file=quiet, show=False):
        pass
    assert quiet.getvalue() == ""
