"""Forward throughput: entr-jax `Decoder` (jit, f32) vs transformers (torch CPU, no_grad).

Both run the same ~20M-parameter Qwen2-style model (identical weights: transformers builds
and saves it, we load the safetensors) on the same right-padded batch. Prints one JSON
object with tokens/s for each, their ratio and the max |logit difference| on real tokens.

    python benchmarks/forward.py [--batch-size 4 --seq-len 256 --iters 5]
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import tyro
from flax import nnx


@dataclasses.dataclass(frozen=True)
class Args:
    batch_size: int = 4
    seq_len: int = 256
    iters: int = 5
    vocab_size: int = 32000
    hidden_size: int = 384
    intermediate_size: int = 1024
    num_layers: int = 6
    num_heads: int = 6
    num_kv_heads: int = 2
    seed: int = 0


def _time(fn, iters: int) -> float:
    fn()  # warm-up (and compile)
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - start) / iters


def main(args: Args) -> dict:
    import torch
    import transformers

    from entr_jax.model import from_pretrained

    torch.manual_seed(args.seed)
    cfg = transformers.Qwen2Config(
        vocab_size=args.vocab_size, hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size, num_hidden_layers=args.num_layers,
        num_attention_heads=args.num_heads, num_key_value_heads=args.num_kv_heads,
        tie_word_embeddings=True, max_position_embeddings=4096,
    )
    hf = transformers.Qwen2ForCausalLM(cfg).eval()
    n_params = sum(p.numel() for p in hf.parameters())
    with tempfile.TemporaryDirectory() as tmp:
        hf.save_pretrained(tmp, safe_serialization=True)
        ours = from_pretrained(tmp)

    rng = np.random.RandomState(args.seed)
    b, length = args.batch_size, args.seq_len
    ids = rng.randint(0, args.vocab_size, (b, length)).astype(np.int32)
    lengths = rng.randint(length // 2, length + 1, (b,))
    mask = np.arange(length)[None, :] < lengths[:, None]

    graphdef, state = nnx.split(ours)

    @jax.jit
    def forward(st, i, m):
        return nnx.merge(graphdef, st)(i, m)

    ids_j, mask_j = jnp.asarray(ids), jnp.asarray(mask)
    jax_s = _time(lambda: forward(state, ids_j, mask_j).block_until_ready(), args.iters)

    ids_t = torch.tensor(ids, dtype=torch.long)
    mask_t = torch.tensor(mask, dtype=torch.long)

    def torch_fwd():
        with torch.no_grad():
            return hf(input_ids=ids_t, attention_mask=mask_t).logits

    torch_s = _time(torch_fwd, args.iters)
    diff = np.abs(np.asarray(forward(state, ids_j, mask_j)) - torch_fwd().numpy())[mask].max()
    tokens = b * length
    result = {
        "benchmark": "forward",
        "model": "qwen2-style", "params": int(n_params), "batch_size": b, "seq_len": length,
        "dtype": "float32", "jax_backend": jax.default_backend(),
        "torch_threads": torch.get_num_threads(), "iters": args.iters,
        "jax_tokens_per_s": round(tokens / jax_s, 1),
        "torch_tokens_per_s": round(tokens / torch_s, 1),
        "ratio_jax_over_torch": round(torch_s / jax_s, 3),
        "max_abs_logit_diff": float(diff),
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main(tyro.cli(Args))
