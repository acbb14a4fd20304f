"""SGLang server processes started by this process: start, wait until they answer,
relaunch one on a new checkpoint, stop them all (no orphans).

Each command (`LaunchCommand`, as `samplers.sglang_launch` builds them) runs in a session of its own, so
stopping it stops the whole process group: SGLang's server forks scheduler and detokenizer
processes that a signal to the parent alone would leave behind. `LocalServers.relaunch`
is a `samplers.sglang_config.RelaunchFn`: the fleet calls it when a weight reload killed a
server (``docs/sglang.md``, section 3).
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import signal
import subprocess
import time
from typing import Sequence

import httpx


@dataclasses.dataclass(frozen=True)
class LaunchCommand:
    """One process to start: extra environment variables and the argument vector."""

    env: dict[str, str]
    argv: tuple[str, ...]

    def shell(self) -> str:
        """The command as one POSIX shell line (env assignments first)."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        return (env + " " if env else "") + shlex.join(self.argv)


def with_flag(argv: Sequence[str], flag: str, value: str) -> tuple[str, ...]:
    """``argv`` with ``flag value`` set: the value after an existing ``flag`` replaced (or
    in ``flag=value`` form), else both appended."""
    out = list(argv)
    for i, a in enumerate(out):
        if a == flag and i + 1 < len(out):
            out[i + 1] = value
            return tuple(out)
        if a.startswith(flag + "="):
            out[i] = f"{flag}={value}"
            return tuple(out)
    return tuple(out + [flag, value])


class LocalServers:
    """Server processes of one launch.

    Args:
      commands: what to start (servers, then maybe a router).
      urls: the base URL each command serves, None for one the fleet does not address
        (e.g. the router): `relaunch` finds a server by it and `wait_ready` polls its
        ``/health``.
      log_dir: when set, each process writes stdout+stderr to ``log_dir/server-<i>.log``
        (appended across relaunches); else they inherit this process's.
      ready_timeout_s: how long `wait_ready` and `relaunch` wait for ``/health``, seconds.
    """

    def __init__(self, commands: Sequence[LaunchCommand], urls: Sequence[str | None],
                 log_dir: str | None = None, ready_timeout_s: float = 600.0):
        if len(commands) != len(urls):
            raise ValueError(f"LocalServers: {len(commands)} commands but {len(urls)} urls")
        self.commands = list(commands)
        self.urls = list(urls)
        self.log_dir = log_dir
        self.ready_timeout_s = ready_timeout_s
        self.procs: list[subprocess.Popen | None] = [None] * len(commands)

    def start(self) -> None:
        """Start every command (each in its own session)."""
        for i in range(len(self.commands)):
            self._start(i)

    def _start(self, i: int) -> None:
        cmd = self.commands[i]
        out = None
        if self.log_dir:
            os.makedirs(self.log_dir, exist_ok=True)
            out = open(os.path.join(self.log_dir, f"server-{i}.log"), "ab")  # noqa: SIM115
        try:
            self.procs[i] = subprocess.Popen(list(cmd.argv), env={**os.environ, **cmd.env},
                                             stdout=out, stderr=subprocess.STDOUT if out else None,
                                             start_new_session=True)
        finally:
            if out is not None:
                out.close()  # the child holds its own descriptor

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Wait until every server answers ``GET /health`` with 200.

        Raises:
          RuntimeError: a process exited first (its status and log are named), or
            ``timeout_s`` (default ``ready_timeout_s``) passed.
        """
        for i, url in enumerate(self.urls):
            if url is not None:
                self._wait_one(i, timeout_s)

    def _wait_one(self, i: int, timeout_s: float | None) -> None:
        url, proc = self.urls[i], self.procs[i]
        deadline = time.monotonic() + (timeout_s or self.ready_timeout_s)
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"the SGLang server for {url} exited with status "
                                   f"{proc.returncode} before answering{self._log_note(i)}")
            try:
                if httpx.get(url + "/health", timeout=5.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"the SGLang server for {url} did not answer /health within "
                           f"{timeout_s or self.ready_timeout_s:g} s{self._log_note(i)}")

    def _log_note(self, i: int) -> str:
        return f" (log: {os.path.join(self.log_dir, f'server-{i}.log')})" if self.log_dir else ""

    def relaunch(self, url: str, model_path: str, version: int) -> None:
        """`samplers.sglang_config.RelaunchFn`: stop the server of ``url`` (whatever is
        left of it), start it again serving ``model_path`` with ``--weight-version
        str(version)``, and wait until it answers.

        Raises:
          ValueError: ``url`` is none of this launch's servers.
          RuntimeError: it did not come back (`wait_ready`).
        """
        if url not in self.urls:
            raise ValueError(f"LocalServers.relaunch: {url} is not one of {self.urls}")
        i = self.urls.index(url)
        self._stop(i)
        argv = with_flag(self.commands[i].argv, "--model-path", model_path)
        argv = with_flag(argv, "--weight-version", str(int(version)))
        self.commands[i] = LaunchCommand(env=self.commands[i].env, argv=argv)
        self._start(i)
        self._wait_one(i, None)

    def wait(self) -> int:
        """Block until every process exited; the highest exit status."""
        return max((p.wait() for p in self.procs if p is not None), default=0)

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM to every process group, SIGKILL to what is left after ``grace_s``."""
        for i in range(len(self.procs)):
            self._signal(i, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for i, p in enumerate(self.procs):
            if p is None:
                continue
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            self._signal(i, signal.SIGKILL)  # the group's other processes too
            p.wait()

    def _stop(self, i: int) -> None:
        p = self.procs[i]
        if p is None:
            return
        self._signal(i, signal.SIGTERM)
        try:
            p.wait(timeout=10.0)
        except subprocess.TimeoutExpired:
            pass
        self._signal(i, signal.SIGKILL)
        p.wait()

    def _signal(self, i: int, sig: int) -> None:
        p = self.procs[i]
        if p is None:
            return
        try:
            os.killpg(p.pid, sig)  # its own session: the group id is its pid
        except ProcessLookupError:
            pass

    def __enter__(self) -> "LocalServers":
        """`start`; leaving the block `stop`s."""
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
