"""A learner started from given weights (``model.path``) never builds a random train state.

Before, the job built the learner with random weights and their AdamW state, then
replaced both with `Learner.load_params`: at the Qwen2.5-0.5B shape in bfloat16 the job's
resident memory reached 8.7 GiB during setup (benchmarks/rehearsal.py), 3x the weights
more than needed. Now `create_train_state(params=...)` / ``Learner(params=...)`` use the
given weights directly; the state must be exactly what ``load_params`` gave.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from entr_jax.model import Decoder, ModelConfig
from entr_jax.sharding import MeshConfig, make_mesh
from learners.learner import Learner, LearnerConfig
from learners.optim import OptimizerConfig
from learners.state import create_train_state

CFG = ModelConfig(architecture="qwen2", vocab_size=11, hidden_size=8, intermediate_size=16,
                  num_layers=1, num_heads=2, num_kv_heads=1, head_dim=4, attention_bias=True,
                  tie_word_embeddings=True)


def _module(seed=0, dtype=jnp.float32):
    return lambda: Decoder(CFG, rngs=nnx.Rngs(seed), dtype=dtype, param_dtype=dtype)


def _flat(state):
    return {".".join(map(str, p)): np.asarray(v.get_value())
            for p, v in nnx.to_flat_state(state)}


def test_given_params_are_the_state_bit_for_bit_and_adam_starts_at_zero():
    mesh = make_mesh(MeshConfig(1, 1, 1), jax.devices()[:1])
    tx = optax.adamw(1e-3)
    given = nnx.state(_module(seed=7)(), nnx.Param)
    expect = _flat(given)
    state, _ = create_train_state(_module(seed=0), tx, mesh, seed=3, params=given)
    got = _flat(state.params)
    assert sorted(got) == sorted(expect) and len(got) == 14  # embed, final norm, 12 in the layer
    for name in expect:
        np.testing.assert_array_equal(got[name], expect[name])
    # seed 0's random weights differ from seed 7's: the given ones won
    random_state, _ = create_train_state(_module(seed=0), tx, mesh)
    assert not np.array_equal(_flat(random_state.params)["embed_tokens.embedding"],
                              expect["embed_tokens.embedding"])
    mu = jax.tree.leaves(state.opt_state[0].mu)
    assert all(float(jnp.max(jnp.abs(m))) == 0.0 for m in mu) and len(mu) == 14
    assert int(state.step) == 0 and int(state.version) == 0
    np.testing.assert_array_equal(state.rng, jax.random.PRNGKey(3))


def test_learner_with_params_equals_random_init_then_load_params():
    config = LearnerConfig(mesh=MeshConfig(1, 1, 1), optimizer=OptimizerConfig(learning_rate=1e-3))
    given = nnx.state(_module(seed=5)(), nnx.Param)
    expect = _flat(given)
    direct = Learner(_module(seed=0), config, devices=jax.devices()[:1],
                     params=jax.tree.map(jnp.copy, given))
    loaded = Learner(_module(seed=0), config, devices=jax.devices()[:1])
    loaded.load_params(given)
    for a, b in zip(jax.tree.leaves(direct.state), jax.tree.leaves(loaded.state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for name, value in _flat(direct.state.params).items():
        np.testing.assert_array_equal(value, expect[name])


def test_bfloat16_module_casts_float32_params_and_wrong_shapes_are_named():
    mesh = make_mesh(MeshConfig(1, 1, 1), jax.devices()[:1])
    given = nnx.state(_module(seed=1)(), nnx.Param)  # float32
    expect = _flat(given)["embed_tokens.embedding"].astype(jnp.bfloat16)
    state, _ = create_train_state(_module(dtype=jnp.bfloat16), optax.sgd(0.1), mesh,
                                  params=given)
    emb = _flat(state.params)["embed_tokens.embedding"]
    assert emb.dtype == jnp.bfloat16
    np.testing.assert_array_equal(emb, expect)

    wrong = Decoder(ModelConfig(**{**CFG.__dict__, "vocab_size": 12}), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"initial param embed_tokens\.embedding has shape "
                                         r"\(12, 8\), the module's is \(11, 8\)"):
        create_train_state(_module(), optax.sgd(0.1), mesh, params=nnx.state(wrong, nnx.Param))
