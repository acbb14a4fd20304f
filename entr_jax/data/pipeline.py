"""Deterministic, checkpointable prompt-batch iterator built on grain ``MapDataset``.

Pipeline: ``MapDataset.source(examples).shuffle(seed).batch(P, drop_remainder=True)
.repeat(num_epochs)``. grain reseeds the shuffle each epoch (``repeat(reseed_each_epoch
=True)``), so every epoch is a different permutation, fixed by the seed; batches never
straddle two epochs (the last ``N mod P`` examples of each epoch's permutation are
dropped, a different subset each epoch). The iterator state is grain's
``DatasetIterator.get_state()`` plus the configuration it belongs to, all JSON-serialisable,
so a restored iterator continues mid-epoch with exactly the same batches.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any, Sequence

Example = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class PromptDataConfig:
    """Configuration of `PromptBatchIterator`.

    Attributes:
      batch_size: prompts per batch ``P`` (>= 1, at most the number of examples).
      seed: shuffle seed (same seed, same order).
      shuffle: shuffle the examples (False: file order every epoch).
      num_epochs: epochs to run, or None for an endless stream.
    """

    batch_size: int = 8
    seed: int = 0
    shuffle: bool = True
    num_epochs: int | None = None

    def __post_init__(self):
        if self.batch_size < 1:
            raise ValueError(f"PromptDataConfig.batch_size must be >= 1, got {self.batch_size}")
        if self.num_epochs is not None and self.num_epochs < 1:
            raise ValueError(
                f"PromptDataConfig.num_epochs must be None or >= 1, got {self.num_epochs}"
            )


def _fingerprint(examples: Sequence[Example]) -> str:
    digest = hashlib.sha256()
    for ex in examples:
        digest.update(str(ex.get("id")).encode())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


class PromptBatchIterator:
    """Yields lists of ``batch_size`` example dicts, deterministically from the seed.

    Each yielded example is a shallow copy of the source example with ``"epoch"`` added.
    `get_state` / `set_state` save and restore the position (JSON-serialisable dict);
    `set_state` rejects a state written for other examples or another configuration.

    Raises:
      ValueError: when there are fewer examples than ``batch_size`` or ids repeat.
    """

    def __init__(self, examples: Sequence[Example], config: PromptDataConfig):
        import grain

        examples = list(examples)
        if len(examples) < config.batch_size:
            raise ValueError(
                f"PromptBatchIterator: {len(examples)} examples < batch_size {config.batch_size}"
            )
        ids = [ex.get("id") for ex in examples]
        if len(set(ids)) != len(ids):
            raise ValueError("PromptBatchIterator: examples must have unique 'id' fields")
        self.config = config
        self.batches_per_epoch = len(examples) // config.batch_size
        self._fingerprint = _fingerprint(examples)
        ds = grain.MapDataset.source(examples)
        if config.shuffle:
            ds = ds.shuffle(seed=config.seed)
        ds = ds.batch(config.batch_size, drop_remainder=True, batch_fn=list)
        ds = ds.repeat(config.num_epochs)
        # Examples are in memory: read synchronously (no prefetch threads).
        read_options = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)
        self._iter = iter(ds.to_iter_dataset(read_options))
        self._batch_index = 0

    @property
    def epoch(self) -> int:
        """Epoch of the next batch (0-based)."""
        return self._batch_index // self.batches_per_epoch

    def __iter__(self) -> "PromptBatchIterator":
        return self

    def __next__(self) -> list[Example]:
        batch = next(self._iter)  # StopIteration after num_epochs
        epoch = self.epoch
        self._batch_index += 1
        return [dict(ex, epoch=epoch) for ex in batch]

    def _config_dict(self) -> dict:
        return dataclasses.asdict(self.config) | {"fingerprint": self._fingerprint}

    def get_state(self) -> dict:
        """JSON-serialisable position: grain iterator state, batch index and configuration."""
        state = {
            "grain": self._iter.get_state(),
            "batch_index": self._batch_index,
            "config": self._config_dict(),
        }
        json.dumps(state)  # fail here, not at checkpoint time, if grain's state changes
        return state

    def set_state(self, state: dict) -> None:
        """Restores a position saved by `get_state` (possibly after a JSON round trip)."""
        for key in ("grain", "batch_index", "config"):
            if key not in state:
                raise ValueError(f"PromptBatchIterator.set_state: state lacks {key!r}")
        if state["config"] != self._config_dict():
            raise ValueError(
                "PromptBatchIterator.set_state: state was saved for another configuration "
                f"or example set: {state['config']} != {self._config_dict()}"
            )
        self._iter.set_state(state["grain"])
        self._batch_index = int(state["batch_index"])
