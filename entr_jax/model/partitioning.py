"""Logical axis names of the decoder's parameters and the one table mapping them to mesh axes.

Every parameter is created with ``out_sharding`` metadata holding logical axis names (see
`nnx.with_partitioning`); ``nnx.get_partition_spec(state)`` returns them, and
``flax.linen.logical_to_mesh_axes(spec, LOGICAL_AXIS_RULES)`` (or
``nnx.logical_axis_rules(LOGICAL_AXIS_RULES)`` as a context) turns them into mesh
`PartitionSpec`s over the mesh axes ``("data", "fsdp", "tensor")``.

Parameter layouts (kernels are ``[in, out]``; every block parameter carries a leading
layer axis ``N``, logical name ``"layers"``, which no mesh axis shards: the decoder scans
over it, reading one layer's slice per step):

  embedding / lm_head      [V, D]             ("vocab", "embed")
  q_proj kernel            [N, D, H*hd]       ("layers", "embed", "heads")
  k_proj, v_proj kernel    [N, D, K*hd]       ("layers", "embed", "kv_heads")
  o_proj kernel            [N, H*hd, D]       ("layers", "heads", "embed")
  q/k/v bias               [N, H*hd]/[N, K*hd] ("layers", "heads") / ("layers", "kv_heads")
  gate_proj, up_proj       [N, D, I]          ("layers", "embed", "mlp")
  down_proj                [N, I, D]          ("layers", "mlp", "embed")
  block RMSNorm scales     [N, D] / [N, hd]   ("layers", "norm") / ("layers", "head_dim")
  final RMSNorm scale      [D]                ("norm",)
"""

from __future__ import annotations

MESH_AXES = ("data", "fsdp", "tensor")

# logical name -> mesh axis (or None: replicated). Activation names ("batch", "length")
# are included so activation constraints can use the same table.
LOGICAL_AXIS_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("layers", None),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("mlp", "tensor"),
    ("head_dim", None),
    ("norm", None),
)
