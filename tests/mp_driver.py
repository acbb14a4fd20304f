"""The main-job CLI with a kill hook and a spy on the advantage function (`Job`'s
``hooks`` and ``advantages`` options), for the multi-process tests.

``python tests/mp_driver.py SPY_PREFIX KILL_AT -- <entr-run arguments>``: every learner
step appends this process's rows (step, batch id, example ids, response ids, rewards, advantages)
to ``SPY_PREFIX.<process index>.jsonl``; at step ``KILL_AT`` (``-1``: never) the process
SIGKILLs itself before training (a ``before_update`` hook run before the job's own), as a
crash would, so nothing of that step is saved.
SIGUSR1 prints every thread's stack (to diagnose a hang).
"""

import faulthandler
import json
import os
import signal
import sys

from experiments.run import job, cli as run
from experiments.run.loop import Hook


def main() -> int:
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # stacks of a hung process
    prefix, kill_at = sys.argv[1], int(sys.argv[2])
    args = sys.argv[sys.argv.index("--") + 1:]
    def kill(info):
        if info.step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    def spying(parts):
        def spy(batch):
            adv = parts.advantages(batch)
            row = {"step": batch.batch_id, "batch": batch.batch_id,  # batch n trains step n
                   "examples": [t.info["example_id"] for t in batch.trajectories],
                   "responses": [t.response_ids.tolist() for t in batch.trajectories],
                   "rewards": [float(t.reward) for t in batch.trajectories],
                   "advantages": adv.tolist()}
            with open(f"{prefix}.{parts.share.index}.jsonl", "a") as f:
                f.write(json.dumps(row) + "\n")
            return adv

        return spy

    init = job.Job.__init__

    def with_spies(self, cfg, **kw):
        init(self, cfg, hooks=[Hook(kill, phase="before_update")], advantages=spying, **kw)

    job.Job.__init__ = with_spies
    return run.main(args)

if __name__ == "__main__":
    sys.exit(main())
