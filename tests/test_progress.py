"""Progress bars written to a log (not a terminal) refresh at most every LOG_INTERVAL_S
seconds of tqdm's clock: a 2000-step warm start written to a sweep's run log was 2000
redraws. The clock here is simulated (each reading 1 s after the one before), so the
counts are the same on any machine."""

import io

from experiments.run import progress


class Terminal(io.StringIO):
    def isatty(self):
        return True


def draws(file, monkeypatch, **kw):
    """The bar's refresh interval and how often it drew over 100 updates."""
    clock = iter(range(10**6))
    monkeypatch.setattr("tqdm.std.time", lambda: float(next(clock)))
    bar = progress.progress_bar(range(100), desc="SFT", file=file, **kw)
    for _ in bar:
        pass
    return getattr(bar, "mininterval", None), file.getvalue().count("\r")  # None: disabled


def test_a_bar_in_a_log_refreshes_rarely_and_on_a_terminal_often(monkeypatch):
    log_interval, log_draws = draws(io.StringIO(), monkeypatch)
    term_interval, term_draws = draws(Terminal(), monkeypatch)
    assert (log_interval, term_interval) == (progress.LOG_INTERVAL_S, 0.1)
    assert term_draws >= 100 and 2 <= log_draws <= term_draws // 10
    assert draws(io.StringIO(), monkeypatch, show=False)[1] == 0
