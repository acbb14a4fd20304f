"""The main-job CLI with a spy on `Job.learn`, for the multi-process tests.

``python tests/mp_driver.py SPY_PREFIX KILL_AT -- <entr-run arguments>``: every learner
step appends this process's rows (step, batch id, example ids, response ids, rewards, advantages)
to ``SPY_PREFIX.<process index>.jsonl``; at step ``KILL_AT`` (``-1``: never) the process
SIGKILLs itself before training, as a crash would, so nothing of that step is saved.
SIGUSR1 prints every thread's stack (to diagnose a hang).
"""

import faulthandler
import json
import os
import signal
import sys

from experiments import loop, run


def main() -> int:
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # stacks of a hung process
    prefix, kill_at = sys.argv[1], int(sys.argv[2])
    args = sys.argv[sys.argv.index("--") + 1:]
    learn = loop.Job.learn

    def spy(self, batch, record):
        if record["step"] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        row = {"step": record["step"], "batch": batch.batch_id,
               "examples": [t.info["example_id"] for t in batch.trajectories],
               "responses": [t.response_ids.tolist() for t in batch.trajectories],
               "rewards": [float(t.reward) for t in batch.trajectories],
               "advantages": self.advantages(batch).tolist()}
        with open(f"{prefix}.{self.share.index}.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        return learn(self, batch, record)

    loop.Job.learn = spy
    return run.main(args)


if __name__ == "__main__":
    sys.exit(main())
