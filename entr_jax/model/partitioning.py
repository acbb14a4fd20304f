"""Logical axis names of the decoder's parameters and the one table mapping them to mesh axes.

Every parameter is created with ``out_sharding`` metadata holding logical axis names (see
`nnx.with_partitioning`); ``nnx.get_partition_spec(state)`` returns them, and
``flax.linen.logical_to_mesh_axes(spec, LOGICAL_AXIS_RULES)`` (or
``nnx.logical_axis_rules(LOGICAL_AXIS_RULES)`` as a context) turns them into mesh
`PartitionSpec`s over the mesh axes ``("data", "fsdp", "tensor")``.

Parameter layouts (kernels are ``[in, out]``):

  embedding / lm_head      [V, D]          ("vocab", "embed")
  q_proj kernel            [D, H*hd]       ("embed", "heads")
  k_proj, v_proj kernel    [D, K*hd]       ("embed", "kv_heads")
  o_proj kernel            [H*hd, D]       ("heads", "embed")
  q/k/v bias               [H*hd]/[K*hd]   ("heads",) / ("kv_heads",)
  gate_proj, up_proj       [D, I]          ("embed", "mlp")
  down_proj                [I, D]          ("mlp", "embed")
  RMSNorm scales           [D] / [hd]      ("norm",) / ("head_dim",)
"""

from __future__ import annotations

MESH_AXES = ("data", "fsdp", "tensor")

# logical name -> mesh axis (or None: replicated). Activation names ("batch", "length")
# are included so activation constraints can use the same table.
LOGICAL_AXIS_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("mlp", "tensor"),
    ("head_dim", None),
    ("norm", None),
)
