"""MeshConfig: resolving -1 and rejecting shapes that do not tile the devices."""

import pytest

from entr_jax.sharding import MeshConfig


@pytest.mark.parametrize("cfg, n, expected", [
    (MeshConfig(), 8, (8, 1, 1)),
    (MeshConfig(data=1, fsdp=-1), 8, (1, 8, 1)),
    (MeshConfig(data=2, fsdp=-1, tensor=2), 8, (2, 2, 2)),
    (MeshConfig(data=-1, fsdp=4), 8, (2, 4, 1)),
    (MeshConfig(data=1, fsdp=1), 1, (1, 1, 1)),
])
def test_resolve(cfg, n, expected):
    assert cfg.resolve(n) == expected


def test_bad_shapes_name_the_field():
    with pytest.raises(ValueError, match="cannot both be -1"):
        MeshConfig(data=-1, fsdp=-1)
    with pytest.raises(ValueError, match="MeshConfig.fsdp"):
        MeshConfig(fsdp=0)
    with pytest.raises(ValueError, match="does not tile 8 devices"):
        MeshConfig(data=3, fsdp=1).resolve(8)
