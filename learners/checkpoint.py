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
shardings; if it cannot be read (e.g. an array file was truncated or deleted) it warns
and falls back to the next newest, and so on.

With several processes, orbax's barriers use the JAX coordination service
(`use_distributed_barriers`) instead of its default device all-gather: an asynchronous
save runs barriers from background threads, and device collectives issued from two
threads at once can be matched in different orders on different processes (orbax's own
warning: "may cause a deadlock"), which hung 2-process CPU runs at their first save.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp
from absl import flags

from learners.state import TrainState

__all__ = ["CheckpointManager", "Restored", "use_distributed_barriers"]

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
    """Result of a restore: ``state`` (`TrainState`), ``step`` (int) and the JSON items."""


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
    ):
        if max_to_keep < 1:
            raise ValueError(f"CheckpointManager: max_to_keep must be >= 1, got {max_to_keep}")
        if save_interval_steps < 1:
            raise ValueError(
                "CheckpointManager: save_interval_steps must be >= 1, got "
                f"{save_interval_steps}"
            )
        self.directory = Path(directory).absolute()
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
        result = Restored(state=state, step=step)
        for name in _JSON_ITEMS:
            result[name] = out[name]
        return result

    def restore_latest(self, target: TrainState, shardings: TrainState) -> Restored | None:
        """Restore the newest readable checkpoint, or return None when there is none.

        A checkpoint that fails to restore is skipped with a `UserWarning` naming its step
        and the error, and the next newest is tried.

        Raises:
          RuntimeError: if checkpoints exist but none of them can be restored.
        """
        self.wait()
        self._manager.reload()
        steps = self.all_steps()
        if not steps:
            return None
        errors = []
        for step in reversed(steps):
            try:
                return self.restore(step, target, shardings)
            except Exception as err:  # noqa: BLE001 - any unreadable checkpoint falls back
                errors.append(f"step {step}: {type(err).__name__}: {err}")
                warnings.warn(
                    f"checkpoint at step {step} in {self.directory} could not be restored "
                    f"({type(err).__name__}: {err}); falling back to an older checkpoint",
                    stacklevel=2,
                )
        raise RuntimeError(
            f"no checkpoint in {self.directory} could be restored: " + "; ".join(errors)
        )

    def wait(self) -> None:
        """Block until any asynchronous save has finished (and raise its error, if any)."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        """Wait for pending saves and release the manager's resources."""
        self._manager.close()
