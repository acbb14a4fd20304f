"""Every failure exits: a checkpoint save that fails in orbax's thread (its directory
replaced by a file mid-run) is one error paragraph and exit status 2, not a process
that waits forever on orbax's threads after printing its error."""

import os
import subprocess
import sys
import textwrap

# the run of `test_resume`, with the checkpoint directory turned into a file at RL step 1
SCRIPT = textwrap.dedent("""
    import pathlib, shutil, sys
    from experiments.run import cli as run
    from experiments.run.job import Job
    from experiments.run.loop import Hook

    run_dir, model = pathlib.Path(sys.argv[1]), sys.argv[2]
    init = Job.__init__

    def sabotage(info):
        if info.step == 1:
            shutil.rmtree(run_dir / "checkpoints")
            (run_dir / "checkpoints").write_text("")

    def with_sabotage(self, cfg, **kw):
        init(self, cfg, hooks=[Hook(sabotage, phase="before_update")], **kw)

    Job.__init__ = with_sabotage
    sys.argv = ["entr-run", "quickstart", "--run_dir", str(run_dir), "--model.path", model,
                "--sft.steps", "0", "--sft.no_save_model", "--rl_steps", "4",
                "--checkpoint.every", "2", "--token_samples_every", "0",
                "--task.prompts_per_step", "2", "--task.samples_per_prompt", "2",
                "--task.max_new_tokens", "4", "--task.max_total_tokens", "4",
                "--task.eval_examples", "2", "--task.eval_samples", "1",
                "--staleness.inter_lag", "1", "--staleness.intra_switches", "0"]
    run.entry()
""")


def test_a_save_failing_in_orbax_thread_exits_with_its_error(small_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    env = dict(os.environ, ENTR_EXIT_GRACE_S="2", PYTHONPATH=os.getcwd())
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(run_dir), str(small_model_dir)],
                          capture_output=True, text=True, timeout=300, env=env, check=False)
    lines = [x for x in proc.stderr.splitlines() if x.startswith("entr-run:")]
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert lines[0] == (f"entr-run: error: Not a directory: {run_dir}/checkpoints/"
                        "2.orbax-checkpoint-tmp. Traceback: "
                        f"{run_dir}/logs/error.log. Run with --debug (or ENTR_DEBUG=1) for "
                        "the traceback.")
    assert lines[1].startswith("entr-run: exiting with status 2; ")
    assert "background thread(s) still waiting 2 s after the failure" in lines[1]
