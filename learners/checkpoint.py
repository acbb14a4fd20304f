"""Checkpoints of the learner with orbax's `CheckpointManager`.

One checkpoint (a step directory ``<dir>/<step>``) holds the items

* ``params``: the trained parameters (`nnx.State`), `StandardSave`;
* ``opt_state``: the optax state, `StandardSave`;
* ``meta``: ``{"version", "step", "rng"}`` arrays, `StandardSave`;
* ``data_state``, ``queue_state``, ``config``: JSON (data-iterator state,
  staleness-queue state, resolved config), `JsonSave`.

Saves are asynchronous (the step loop continues while files are written) and atomic:
orbax writes into a temporary directory and renames it only when every item is complete,
so a crash during a save leaves the previous checkpoints untouched and the temporary
directory is never listed as a step. The last ``max_to_keep`` are kept.

`CheckpointManager.restore_latest` restores the newest checkpoint into the target
shardings; if it cannot be read (e.g. an array file was truncated or deleted), or the
caller's ``verify`` rejects it (e.g. a side file saved with it is damaged), it warns in
one line (`CheckpointFallbackWarning`, naming the step and the path) and falls back to
the next newest, and so on; the full error goes to ``log_file``, and the unrestorable
newer step directories are moved to ``<directory>_unrestorable/`` (kept, not deleted;
orbax would not save those steps again). When none can be restored it raises
`CheckpointRestoreError`, again one line pointing at ``log_file``.

With several processes, orbax's barriers use the JAX coordination service
(`use_distributed_barriers`) instead of its default device all-gather: an asynchronous
save runs barriers from background threads, and device collectives issued from two
threads at once can be matched in different orders on different processes (orbax's own
warning: "may cause a deadlock"), which hung 2-process CPU runs at their first save.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable

import jax
import orbax.checkpoint as ocp
from absl import flags

from learners.state import TrainState

__all__ = ["CheckpointFallbackWarning", "CheckpointManager", "CheckpointRestoreError", "Restored",
           "use_distributed_barriers"]

_JSON_ITEMS = ("data_state", "queue_state", "config")


def use_distributed_barriers() -> None:
    """Make orbax synchronise processes through the coordination service (thread-safe
    barriers with timeouts) rather than device collectives. Sets orbax's absl flag
    ``experimental_orbax_use_distributed_barrier``; absl flags are marked parsed first
    when nothing parsed them (the job never uses absl's command line)."""
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
    setattr(flags.FLAGS, ocp.multihost.EXPERIMENTAL_ORBAX_USE_DISTRIBUTED_BARRIER.name, True)


class Restored(dict):
    """Result of a restore: ``state`` (`TrainState`), ``step`` (int), ``path`` (the step
    directory), the JSON items and ``verified`` (what ``verify`` returned, or None)."""


class CheckpointFallbackWarning(UserWarning):
    """The newest checkpoint could not be restored; an older one is tried."""


class CheckpointRestoreError(RuntimeError):
    """Checkpoints exist but none of them can be restored: ``tried`` (the steps, newest
    first), ``newest`` (the first line of the newest one's error), ``log_file``."""

    def __init__(self, message: str, tried: list[int], newest: str, log_file: Path):
        super().__init__(message)
        self.tried, self.newest, self.log_file = tried, newest, log_file


def _first_line(err: BaseException, limit: int = 200) -> str:
    text = next((line.strip() for line in str(err).splitlines() if line.strip()), "")
    text = f"{type(err).__name__}: {text}" if text else type(err).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _is_leftover(unraisable: Any) -> bool:
    """An exception a failed restore leaves behind: orbax's pending reads complete on an
    event loop it has closed (``RuntimeError: Event loop is closed``), or its coroutines
    are collected unfinished."""
    return (inspect.iscoroutine(unraisable.object)
            or (unraisable.exc_type is RuntimeError
                and "Event loop is closed" in str(unraisable.exc_value)))


def _route_leftovers(log: Callable[[str], None]) -> None:
    """From now on, send the leftovers of a failed restore (`_is_leftover`; printed by
    Python as unraisable exceptions, up to hundreds of traceback lines on stderr, some at
    exit) to ``log`` as one line each; any other unraisable exception still goes to the
    previous hook. Installed once per process."""
    previous = sys.unraisablehook
    if getattr(previous, "entr_leftovers", False):
        return

    def hook(unraisable: Any) -> None:
        if not _is_leftover(unraisable):
            previous(unraisable)
            return
        with contextlib.suppress(Exception):  # at exit, even writing a log line may fail
            log(f"ignored after a failed restore: {unraisable.exc_type.__name__}: "
                f"{unraisable.exc_value} ({unraisable.object!r:.200})")

    hook.entr_leftovers = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook


def _abstract(tree: Any, shardings: Any) -> Any:
    """`jax.ShapeDtypeStruct`s of ``tree`` carrying the target ``shardings``."""
    return jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings
    )


class CheckpointManager:
    """Save and restore `TrainState` + JSON side items under ``directory``.

    Args:
      directory: where step directories live (created if missing).
      max_to_keep: number of most recent checkpoints kept (>= 1).
      save_interval_steps: `save` only writes when ``step % save_interval_steps == 0``
        (``force=True`` overrides).
      async_save: write in a background thread (call `wait` or `close` before exit).
      log_file: where `restore_latest` writes the full error of every checkpoint it could
        not restore (default ``<directory>_restore.log`` beside the directory).
      verify: ``verify(step, restored) -> value``, called by `restore_latest` after a
        checkpoint's arrays are restored; raising makes it fall back to the next older
        checkpoint like an unreadable one; the value is ``restored["verified"]``.

    Every process must call `save`/`restore_latest` (orbax coordinates the processes and
    writes each array shard from the process that owns it); metadata is written by
    process 0.
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        max_to_keep: int = 3,
        save_interval_steps: int = 1,
        async_save: bool = True,
        log_file: str | Path | None = None,
        verify: Callable[[int, "Restored"], Any] | None = None,
    ):
        if max_to_keep < 1:
            raise ValueError(f"CheckpointManager: max_to_keep must be >= 1, got {max_to_keep}")
        if save_interval_steps < 1:
            raise ValueError(
                "CheckpointManager: save_interval_steps must be >= 1, got "
                f"{save_interval_steps}"
            )
        self.directory = Path(directory).absolute()
        self.log_file = (Path(log_file) if log_file is not None
                         else self.directory.with_name(self.directory.name + "_restore.log"))
        self.verify = verify
        if jax.process_count() > 1:
            use_distributed_barriers()
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep,
            save_interval_steps=save_interval_steps,
            enable_async_checkpointing=async_save,
            create=True,
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    def save(
        self,
        state: TrainState,
        *,
        data_state: Any = None,
        queue_state: Any = None,
        config: Any = None,
        force: bool = False,
    ) -> bool:
        """Start saving ``state`` (at ``int(state.step)``) and the JSON items.

        JSON items must be JSON-serialisable (``None`` is stored as ``null``). Returns
        whether a save was started (False when the interval says to skip this step).
        """
        step = int(jax.device_get(state.step))
        meta = {"version": state.version, "step": state.step, "rng": state.rng}
        items = {
            "params": ocp.args.StandardSave(state.params),
            "opt_state": ocp.args.StandardSave(state.opt_state),
            "meta": ocp.args.StandardSave(meta),
            "data_state": ocp.args.JsonSave(data_state),
            "queue_state": ocp.args.JsonSave(queue_state),
            "config": ocp.args.JsonSave(config),
        }
        return self._manager.save(step, args=ocp.args.Composite(**items), force=force)

    def all_steps(self) -> list[int]:
        """Steps of the complete checkpoints on disk, ascending."""
        return sorted(self._manager.all_steps())

    def restore(self, step: int, target: TrainState, shardings: TrainState) -> Restored:
        """Restore checkpoint ``step`` into arrays with the given ``shardings``.

        ``target`` supplies the tree structure, shapes and dtypes (a live state or the
        abstract one from `learners.state.abstract_train_state`).
        """
        meta_target = {"version": target.version, "step": target.step, "rng": target.rng}
        meta_sh = {"version": shardings.version, "step": shardings.step, "rng": shardings.rng}
        args = ocp.args.Composite(
            params=ocp.args.StandardRestore(_abstract(target.params, shardings.params)),
            opt_state=ocp.args.StandardRestore(_abstract(target.opt_state, shardings.opt_state)),
            meta=ocp.args.StandardRestore(_abstract(meta_target, meta_sh)),
            **{name: ocp.args.JsonRestore() for name in _JSON_ITEMS},
        )
        out = self._manager.restore(step, args=args)
        meta = out["meta"]
        state = target.replace(
            params=out["params"],
            opt_state=out["opt_state"],
            version=meta["version"],
            step=meta["step"],
            rng=meta["rng"],
        )
        result = Restored(state=state, step=step, path=str(self.directory / str(step)))
        for name in _JSON_ITEMS:
            result[name] = out[name]
        return result

    def restore_latest(self, target: TrainState, shardings: TrainState) -> Restored | None:
        """Restore the newest readable (and verified) checkpoint, or return None when there
        is none.

        A checkpoint that fails to restore or to verify is skipped with a one-line
        `CheckpointFallbackWarning` naming its step and path (the full error goes to
        ``log_file``), and the next newest is tried.

        Raises:
          CheckpointRestoreError: checkpoints exist but none of them can be restored (one
            line naming the directory, the steps tried and ``log_file``).
        """
        self.wait()
        self._manager.reload()
        steps = self.all_steps()
        if not steps:
            return None
        tried, newest = [], ""
        for i, step in enumerate(reversed(steps)):
            try:
                result = self.restore(step, target, shardings)
                result["verified"] = (self.verify(step, result) if self.verify is not None
                                      else None)
            except Exception as err:  # noqa: BLE001 - any unreadable checkpoint falls back
                _route_leftovers(self._log)
                tried.append(step)
                newest = newest or _first_line(err)
                self._log(f"checkpoint step {step} at {self.directory / str(step)} could not "
                          "be restored:\n" + "".join(traceback.format_exception(err)))
                if i + 1 < len(steps):
                    warnings.warn(
                        f"checkpoint step {step} at {self.directory / str(step)} cannot be "
                        f"restored ({_first_line(err)}); falling back to step "
                        f"{steps[-i - 2]} (details: {self.log_file})",
                        CheckpointFallbackWarning, stacklevel=2)
                continue
            if tried:
                self.set_aside(tried)
            return result
        raise CheckpointRestoreError(
            f"no checkpoint in {self.directory} can be restored (tried steps "
            f"{', '.join(map(str, tried))}; the newest: {newest}); details: {self.log_file}. "
            f"To start over, move {self.directory} away", tried, newest, self.log_file)

    @property
    def unrestorable_dir(self) -> Path:
        """Where checkpoints that could not be restored are moved (nothing is deleted)."""
        return self.directory.with_name(self.directory.name + "_unrestorable")

    def set_aside(self, steps: list[int]) -> None:
        """Move step directories that cannot be restored to `unrestorable_dir` (kept, not
        deleted): orbax would otherwise refuse to save those steps again (``save`` returns
        False for a step that exists), so a resumed run would silently skip its
        checkpoints."""
        if jax.process_index() == 0:
            for step in steps:
                target = self.unrestorable_dir / str(step)
                k = 1
                while target.exists():
                    target, k = self.unrestorable_dir / f"{step}.{k}", k + 1
                target.parent.mkdir(parents=True, exist_ok=True)
                (self.directory / str(step)).rename(target)
                self._log(f"moved unrestorable checkpoint step {step} to {target}")
        if jax.process_count() > 1:
            ocp.multihost.sync_global_processes("entr_checkpoint_set_aside")
        self._manager.reload()

    def _log(self, text: str) -> None:
        if jax.process_index() != 0:
            return
        # an unwritable log loses only the detail: the one-line warning/error that goes
        # with it still says what failed and where
        with contextlib.suppress(OSError):
            self.log_file.parent.mkdir(parents=True, exist_ok=True)
            with open(self.log_file, "a", encoding="utf-8") as f:
                f.write(f"[{time.strftime('%Y-%m-%dT%H:%M:%S%z')}] {text.rstrip()}\n")

    def wait(self) -> None:
        """Block until any asynchronous save has finished (and raise its error, if any)."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        """Wait for pending saves and release the manager's resources."""
        self._manager.close()
