"""The device mesh and the mapping from logical axis names to `NamedSharding`s.

Mesh axes are named once, in `entr_jax.model.partitioning.MESH_AXES` =
``("data", "fsdp", "tensor")``; parameters carry logical axis names (``"embed"``,
``"mlp"``, ...) that the model's ``LOGICAL_AXIS_RULES`` table maps to those mesh axes
(``docs/design.md``, "Jit and sharding"). A single device is the 1x1x1 mesh:
every function here works unchanged on it.

Batch arrays shard their row axis over ``("data", "fsdp")`` (the ``"batch"`` rule) and
replicate everything else. A parameter dimension whose size is not divisible by the
number of devices on its mesh axes is replicated instead (jit arguments must divide
evenly); `state_shardings` reports no error for that, it simply keeps the array whole
along that dimension.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import flax.linen as nn
import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from entr_jax.model.partitioning import LOGICAL_AXIS_RULES, MESH_AXES

__all__ = [
    "BATCH_AXES",
    "MESH_AXES",
    "MeshConfig",
    "batch_sharding",
    "make_mesh",
    "replicated",
    "spec_for_shape",
    "state_shardings",
]

# Mesh axes the row (batch) dimension of every host batch is split over.
BATCH_AXES: tuple[str, ...] = ("data", "fsdp")

Rules = Sequence[tuple[str, Any]]


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Shape of the learner mesh.

    Attributes:
      data: data-parallel replicas (parameters replicated across them).
      fsdp: fully-sharded data parallel (parameters sharded along their ``"embed"`` axis,
        batch rows split as well).
      tensor: tensor parallel (heads / MLP / vocabulary dimensions); 1 disables it.

    At most one of ``data`` and ``fsdp`` may be ``-1``: it takes every device left over by
    the other axes (``data=-1, fsdp=1``: pure data parallel; ``data=1, fsdp=-1``: FSDP over
    all devices).
    """

    data: int = -1
    fsdp: int = 1
    tensor: int = 1

    def __post_init__(self):
        for name in ("data", "fsdp"):
            value = getattr(self, name)
            if value != -1 and value < 1:
                raise ValueError(f"MeshConfig.{name} must be >= 1 or -1, got {value}")
        if self.data == -1 and self.fsdp == -1:
            raise ValueError("MeshConfig.data and MeshConfig.fsdp cannot both be -1")
        if self.tensor < 1:
            raise ValueError(f"MeshConfig.tensor must be >= 1, got {self.tensor}")

    def resolve(self, num_devices: int) -> tuple[int, int, int]:
        """``(data, fsdp, tensor)`` with ``-1`` resolved; raises if it does not tile the devices."""
        data, fsdp = self.data, self.fsdp
        if fsdp == -1:
            fsdp = num_devices // (data * self.tensor)
        if data == -1:
            data = num_devices // (fsdp * self.tensor)
        if data < 1 or fsdp < 1 or data * fsdp * self.tensor != num_devices:
            raise ValueError(
                f"MeshConfig(data={self.data}, fsdp={self.fsdp}, tensor={self.tensor}) does "
                f"not tile {num_devices} devices"
            )
        return data, fsdp, self.tensor


def make_mesh(config: MeshConfig = MeshConfig(), devices: Sequence[Any] | None = None) -> Mesh:
    """Build the ``("data", "fsdp", "tensor")`` mesh over ``devices`` (default: all devices).

    Uses `jax.make_mesh` (device order chosen for the interconnect) when every device of the
    process group is used, and a plain reshape of ``devices`` otherwise (tests that compare
    a 1-device mesh with an 8-device one).
    """
    if devices is None:
        devices = jax.devices()
    shape = config.resolve(len(devices))
    auto = (AxisType.Auto,) * len(MESH_AXES)
    if len(devices) == jax.device_count():
        return jax.make_mesh(shape, MESH_AXES, axis_types=auto, devices=list(devices))
    return Mesh(np.asarray(devices).reshape(shape), MESH_AXES, axis_types=auto)


def spec_for_shape(
    shape: Sequence[int], logical: Sequence[str | None] | None, mesh: Mesh, rules: Rules
) -> PartitionSpec:
    """Mesh `PartitionSpec` for an array of ``shape`` with logical axis names ``logical``.

    Dimensions whose size does not divide by the product of their mesh axis sizes are
    replicated.
    """
    if not logical:
        return PartitionSpec()
    mesh_spec = nn.logical_to_mesh_axes(tuple(logical), rules)
    out = []
    for size, axes in zip(shape, tuple(mesh_spec) + (None,) * (len(shape) - len(mesh_spec))):
        if axes is None:
            out.append(None)
            continue
        names = (axes,) if isinstance(axes, str) else tuple(axes)
        n = int(np.prod([mesh.shape[a] for a in names]))
        out.append(axes if size % n == 0 else None)
    return PartitionSpec(*out)


def state_shardings(abstract_tree: Any, mesh: Mesh, rules: Rules = LOGICAL_AXIS_RULES) -> Any:
    """`NamedSharding` for every leaf of an (abstract) pytree of NNX state / arrays.

    ``abstract_tree`` may hold `nnx.Variable`s carrying ``out_sharding`` logical axis
    metadata (as produced by ``nnx.eval_shape`` + ``nnx.split``), plain arrays or
    `jax.ShapeDtypeStruct`s (replicated), and optax states built from such params (their
    per-parameter moments keep the parameter's `nnx.Variable` box and metadata). Returns
    the same tree structure (Variable boxes kept) with `NamedSharding` values, so it can be
    passed to ``jax.jit(in_shardings=..., out_shardings=...)`` and ``jax.device_put``.
    """

    def one(leaf):
        if isinstance(leaf, nnx.Variable):
            value = leaf.get_value()
            logical = leaf.get_metadata().get("out_sharding")
            spec = spec_for_shape(getattr(value, "shape", ()), logical, mesh, rules)
            return leaf.replace(NamedSharding(mesh, spec))
        return NamedSharding(mesh, PartitionSpec())

    return jax.tree.map(one, abstract_tree, is_leaf=lambda x: isinstance(x, nnx.Variable))


def batch_sharding(mesh: Mesh, ndim: int, row_axis: int = 0) -> NamedSharding:
    """Sharding of a host-batch array of rank ``ndim``: ``row_axis`` over `BATCH_AXES`."""
    spec = [None] * ndim
    spec[row_axis] = BATCH_AXES
    return NamedSharding(mesh, PartitionSpec(*spec))


def replicated(mesh: Mesh) -> NamedSharding:
    """Fully replicated sharding on ``mesh`` (scalars, metrics)."""
    return NamedSharding(mesh, PartitionSpec())
