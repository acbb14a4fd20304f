"""Checkpoint side item of the RL loop: the parameter ring (``.npz`` next to each orbax
checkpoint)."""

from __future__ import annotations

import os
import pathlib
from typing import Any, Iterable

import jax
import jax.numpy as jnp
import numpy as np

from entr_jax.staleness import ParamRing


class RingFileError(RuntimeError):
    """A parameter-ring snapshot is missing, truncated or does not match its checkpoint."""


def save_ring(path: pathlib.Path, ring: ParamRing) -> dict[str, Any]:
    """Write every version in ``ring`` (flat leaves ``v{version}_{i}`` plus ``versions``)
    to ``path`` atomically: ``<path>.tmp``, fsync, then `os.replace`, so a crash or a full
    disk never leaves a partial ``path`` (the temporary file is removed on failure).

    Returns the record a checkpoint stores to check the file on restore:
    ``{"file": name, "bytes": size, "versions": [...]}``.

    Raises:
      OSError: the write failed (``filename`` is the ring file); nothing is left behind.
    """
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    flat = {f"v{v}_{i}": np.asarray(leaf)
            for v in ring.versions for i, leaf in enumerate(jax.tree.leaves(ring.get(v)))}
    # .npy has no bfloat16: such arrays are stored as raw 2-byte records ("V2"), so the
    # dtype names are stored too and `load_ring` views the bytes back as them
    dtypes = np.array([str(flat[f"v{v}_{i}"].dtype) for v in ring.versions[-1:]
                       for i in range(len(jax.tree.leaves(ring.get(v))))])
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            np.savez(f, versions=np.array(ring.versions), dtypes=dtypes, **flat)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        if isinstance(err, OSError) and err.filename is None:
            err.filename = str(path)
        raise
    return {"file": path.name, "bytes": path.stat().st_size, "versions": list(ring.versions)}


def _stored_array(arr: np.ndarray, dtype_name: str | None) -> jax.Array:
    """A ring array as saved, its raw records (bfloat16) viewed back as ``dtype_name``."""
    if dtype_name is not None and str(arr.dtype) != dtype_name:
        want = jnp.dtype(dtype_name)
        if arr.dtype.kind != "V" or arr.dtype.itemsize != want.itemsize:
            raise ValueError(f"an array of dtype {arr.dtype} where {dtype_name} was saved")
        arr = arr.view(want)
    return jnp.asarray(arr)


def load_ring(path: pathlib.Path, size: int, template: Any,
              expect: dict[str, Any] | None = None) -> ParamRing:
    """A new `ParamRing` of ``size`` holding the versions saved by `save_ring` (structure of
    ``template``). Every array is read, so zip CRC errors surface here.

    ``expect``: the record `save_ring` returned when the checkpoint was made; the file's
    size and versions must match it.

    Raises:
      RingFileError: one line naming the file and what is wrong with it.
    """
    path = pathlib.Path(path)
    if not path.is_file():
        raise RingFileError(f"parameter ring {path} is missing")
    if expect is not None and path.stat().st_size != expect["bytes"]:
        raise RingFileError(f"parameter ring {path} has {path.stat().st_size} bytes, its "
                            f"checkpoint recorded {expect['bytes']} (truncated or replaced)")
    treedef = jax.tree.structure(template)
    ring: ParamRing = ParamRing(size)
    try:
        with np.load(path) as z:
            versions = [int(v) for v in z["versions"].tolist()]
            names = z["dtypes"].tolist() if "dtypes" in z.files else None
            for v in versions:
                leaves = [_stored_array(z[f"v{v}_{i}"], None if names is None else names[i])
                          for i in range(treedef.num_leaves)]
                ring.push(v, jax.tree.unflatten(treedef, leaves))
    except Exception as err:  # noqa: BLE001 - BadZipFile, CRC, missing key, short read
        raise RingFileError(f"parameter ring {path} cannot be read "
                            f"({type(err).__name__}: {err})") from None
    if expect is not None and versions != list(expect["versions"]):
        raise RingFileError(f"parameter ring {path} holds versions {versions}, its checkpoint "
                            f"recorded {expect['versions']}")
    return ring


def prune_rings(ring_dir: pathlib.Path, kept_steps: Iterable[int]) -> None:
    """Delete ring snapshots whose checkpoint step orbax no longer keeps, and temporary
    files a killed writer left."""
    kept = set(kept_steps)
    ring_dir = pathlib.Path(ring_dir)
    for f in ring_dir.glob("*.npz.tmp"):
        f.unlink(missing_ok=True)
    for f in ring_dir.glob("*.npz"):
        if f.stem.isdigit() and int(f.stem) not in kept:
            f.unlink()
