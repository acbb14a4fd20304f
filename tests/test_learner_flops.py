"""The learner benchmark's FLOP count (benchmarks/learner.py): 6 N per token plus causal
attention, checked against a count of the (query, key) pairs a causal mask keeps."""

from types import SimpleNamespace

from benchmarks.learner import _model_flops


def test_model_flops_counts_weights_and_causal_attention_pairs():
    cfg = SimpleNamespace(num_layers=3, num_heads=4, head_dim=8)
    n_params, batch, length = 1000, 2, 5
    pairs = sum(1 for q in range(length) for k in range(length) if k <= q)  # 15 of 25
    per_pair = 2 * 2 * cfg.num_heads * cfg.head_dim  # QK^T and PV, 2 FLOPs per MAC
    expected = 6 * n_params * batch * length + 3 * cfg.num_layers * batch * pairs * per_pair
    assert _model_flops(cfg, n_params, batch, length) == expected == 60000 + 3 * 3 * 2 * 15 * 128
