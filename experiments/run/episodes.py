"""From prompts to trajectories: the sampling parameters of a batch, the task's episodes,
and this process's share of every training batch.

Used by the rollout sources (`experiments.run.sources`, `experiments.run.async_source`) for
training batches and by `experiments.run.evaluation` for evaluation episodes. Whatever
weights the sampler holds are the ones that sample: staleness is the sources' business.
"""

from __future__ import annotations

from typing import Any, Sequence

from entr_jax.data import PromptBatchIterator
from entr_jax.interfaces import SamplingParams
from entr_jax.tasks.rollout import run_episodes
from entr_jax.tokenizer import Tokenizer
from entr_jax.types import Trajectory
from experiments.run.config import RunConfig
from experiments.run.rollouts import sampling_seed
from experiments.run.tasks import TaskBundle


class Episodes:
    """Episodes of one job (`RunConfig`), with its tokenizer and task.

    Args:
      cfg: the run's config (``sampling``, ``task.max_new_tokens``,
        ``task.samples_per_prompt``, ``task.prompts_per_step``, ``seed``).
      tokenizer, task: the job's (`experiments.run.tasks.build_task`).
      data: the training prompt stream (one global batch of ``task.prompts_per_step``
        prompts per `next`).
      prompt_indices: this process's rows of every global prompt batch
        (`experiments.run.multiprocess.Share.chunk_indices`); its first is the share's
        offset in the sampling seed.
    """

    def __init__(self, cfg: RunConfig, tokenizer: Tokenizer, task: TaskBundle,
                 data: PromptBatchIterator, prompt_indices: Sequence[int]):
        self.cfg, self.tokenizer, self.task, self.data = cfg, tokenizer, task, data
        self.prompt_indices = list(prompt_indices)
        self.prompt_offset = self.prompt_indices[0]

    def sampling(self, batch_id: int, stream: int = 0, offset: int = 0,
                 **overrides) -> SamplingParams:
        """The run's sampling parameters with the seed of (batch, stream, offset)
        (`experiments.run.rollouts.sampling_seed`); ``overrides`` replace fields (e.g.
        ``top_k=1`` for greedy evaluation)."""
        s, t = self.cfg.sampling, self.cfg.task
        kw = dict(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, min_p=s.min_p,
                  max_new_tokens=t.max_new_tokens,
                  stop_token_ids=tuple(self.tokenizer.eos_token_ids),
                  seed=sampling_seed(self.cfg.seed, batch_id, stream, offset))
        kw.update(overrides)
        return SamplingParams(**kw)

    def run(self, sampler: Any, examples: list[dict], params: SamplingParams,
            num_samples: int, group_ids: Sequence[int] | None = None) -> list[Trajectory]:
        """``num_samples`` episodes of every example (example-major), through ``sampler``
        (`entr_jax.tasks.rollout.run_episodes`)."""
        return run_episodes(sampler, self.tokenizer, self.task.env_factory, examples, params,
                            num_samples, self.task.rollout, group_ids)

    def local_prompts(self) -> list[dict]:
        """This process's share of the next global prompt batch."""
        batch = next(self.data)
        return [batch[i] for i in self.prompt_indices]

    def group_ids(self, batch_id: int) -> list[int]:
        """Global group ids of this process's prompts of batch ``batch_id``: each prompt's
        index in the global stream."""
        return [batch_id * self.cfg.task.prompts_per_step + i for i in self.prompt_indices]

    def train_batch(self, sampler: Any, batch_id: int) -> list[Trajectory]:
        """This process's trajectories of training batch ``batch_id``: the next prompts,
        ``task.samples_per_prompt`` episodes each, sampled by ``sampler``."""
        examples = self.local_prompts()
        params = self.sampling(batch_id, offset=self.prompt_offset)
        return self.run(sampler, examples, params, self.cfg.task.samples_per_prompt,
                        self.group_ids(batch_id))
