"""Multi-process runs: two `jax.distributed` processes (CPU, gloo) of the real CLI.

Each process takes its own share of every global prompt batch and its own sampling
streams; the union of the shares is the one-process batch; metrics, advantages and
checkpoints cover both processes (`experiments.run.multiprocess`). The end-to-end tests run
a 2-process job whose processes both SIGKILL themselves mid-run and are resumed (default
suite), and compare it bit for bit with an uninterrupted 2-process job (slow).
"""

import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from flax import nnx

from entr_jax.advantages import AdvantageConfig, compute_advantages
from entr_jax.assets import tiny_dir
from entr_jax.data import PromptBatchIterator, PromptDataConfig
from entr_jax.model import Decoder, ModelConfig, save_pretrained
from entr_jax.tokenizer import Tokenizer
from experiments.run import multiprocess as mp
from experiments.run.config import TaskSpec
from experiments.run.tasks import build_task

REPO = pathlib.Path(__file__).resolve().parents[1]
DRIVER = REPO / "tests" / "mp_driver.py"
# the job of every launch (flags of `entr-run quickstart`)
# 8 samples per prompt: 7 of the first 8 prompts are rewardable (one-digit answers), each
# sample with probability 1/10 (`bigram_model`), so no group has reward variance in 4
# steps with probability 0.43^7 = 0.3% (at 4 samples: 0.66^7 = 5%, which a change of the
# sampler's draws once hit)
TASK = dict(prompts_per_step=2, samples_per_prompt=8, arithmetic_max_chars=3,
            arithmetic_ops="+-")
STEPS, KILL_AT = 4, 3


def bigram_model(path: pathlib.Path) -> pathlib.Path:
    """A 1-layer Qwen2 checkpoint (tiny tokenizer) that is a designed bigram model.

    Attention and MLP outputs are zero, so the logits depend on the current token only:
    after ``=`` the next token is a uniformly random digit (logit 17 vs <= 0.85 for any
    other token), after a digit it is EOS (logit 40 vs 16). A response is one digit, so
    on ``a+b`` / ``a-b`` prompts with a one-digit answer the reward is 1 with probability
    1/10: groups of 8 samples have reward variance often enough for GRPO to move the
    weights, which a random model (reward 0 everywhere) would never do.
    """
    hf = json.loads((tiny_dir() / "config.json").read_text())
    hf.update(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
              num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    model = Decoder(ModelConfig.from_hf_config(hf), rngs=nnx.Rngs(0))
    tok = Tokenizer.from_pretrained(tiny_dir())
    (eq,) = tok.encode("=")
    digits = [tok.encode(str(d))[0] for d in range(10)]
    eos = tok.eos_token_ids[0]
    emb = np.array(model.embed_tokens.embedding.value)
    emb[:, [0, 2]] = 0.0
    emb[eq] = 0.0
    emb[eq, 0] = 0.05
    emb[digits] = 0.0
    emb[digits, 0] = emb[digits, 2] = 1.0
    emb[eos] = 0.0
    emb[eos, 2] = 10.0
    model.embed_tokens.embedding.value = emb
    scale = np.ones(32, np.float32)
    scale[0] = 3.0
    model.final_norm.scale.value = scale
    layer = model.layers  # the one block (stacked parameters of 1 layer)
    layer.attn.o_proj.kernel.value = np.zeros_like(layer.attn.o_proj.kernel.value)
    layer.mlp.down_proj.kernel.value = np.zeros_like(layer.mlp.down_proj.kernel.value)
    save_pretrained(model, path)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(tiny_dir() / name, path / name)
    return path


def cli_args(model_dir, run_dir, *, staleness_mode: str = "simulated") -> list[str]:
    """Flags of every launch: few steps, tiny batches, evaluation rows bucketed like the
    training rows (fewer compilations); simulated staleness with a pending batch at
    checkpoints (inter lag 1), or real async mode with the measured staleness bounded by 1
    (the config refuses the simulated-only flags there)."""
    args = ["quickstart", "--model.path", str(model_dir), "--run_dir", str(run_dir),
            "--sft.steps", "0", "--rl_steps", str(STEPS), "--checkpoint.every", "2",
            "--checkpoint.keep", "5", "--token_samples_every", "2",
            "--objective.name", "grpo", "--task.max_new_tokens", "4",
            "--task.max_total_tokens", "4", "--task.eval_examples", "2",
            "--task.eval_samples", "4"]
    if staleness_mode == "simulated":
        args += ["--staleness.inter_lag", "1", "--staleness.intra_switches", "0"]
    else:
        args += ["--staleness.mode", staleness_mode, "--staleness.max_staleness", "1"]
    for k, v in TASK.items():
        args += [f"--task.{k}", str(v)]
    return args


def test_launch_arguments_of_the_slow_tests_parse(tmp_path):
    """The slow tests here (not in CI) launch `entr-run` with these flags; the config must
    accept them, so a validation added later fails here, in the default suite, instead of
    leaving a slow test to fail unnoticed (as the async one did after 59c3afc)."""
    from experiments.run.cli import parse

    sim, _ = parse(cli_args(tmp_path / "model", tmp_path / "sim"))
    assert (sim.staleness.mode, sim.staleness.inter_lag) == ("simulated", 1)
    asy, _ = parse(cli_args(tmp_path / "model", tmp_path / "async", staleness_mode="async"))
    assert (asy.staleness.mode, asy.staleness.max_staleness) == ("async", 1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args: list[str], spy: pathlib.Path, kill_at: int, cache: pathlib.Path,
           num_processes: int = 2) -> list[subprocess.CompletedProcess]:
    """Run ``num_processes`` processes of the CLI (through the spy driver); wait for all."""
    port = free_port()
    procs = []
    # one CPU device per process; XLA's cheapest optimisation level (a third less compile
    # time; every run compared here uses it) and a persistent compilation cache (process
    # 0 reuses what an earlier launch compiled)
    xla = ("--xla_force_host_platform_device_count=1 --xla_backend_optimization_level=0 "
           "--xla_llvm_disable_expensive_passes=true")
    for pid in range(num_processes):
        env = dict(os.environ, XLA_FLAGS=xla,
                   JAX_PLATFORMS="cpu", ENTR_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                   ENTR_NUM_PROCESSES=str(num_processes), ENTR_PROCESS_ID=str(pid),
                   JAX_COMPILATION_CACHE_DIR=str(cache),
                   JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                   JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
        procs.append(subprocess.Popen(
            [sys.executable, str(DRIVER), str(spy), str(kill_at), "--", *args], env=env,
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    out, deadline = [], time.monotonic() + 900
    for k, p in enumerate(procs):
        try:
            stdout, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:  # a hang: print every thread's stack, then fail
            for q in procs:
                q.send_signal(signal.SIGUSR1)
            time.sleep(5)
            for q in procs:
                q.kill()
            logs = [q.communicate()[0] for q in procs]
            for j, log in enumerate(logs):
                pathlib.Path(f"{spy}.{j}.log").write_text(log)
            pytest.fail(f"process {k} hung; its output ends:\n{logs[k][-6000:]}")
        out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout))
        pathlib.Path(f"{spy}.{k}.log").write_text(stdout)
    return out


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in pathlib.Path(path).read_text().splitlines()]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("multiprocess")
    bigram_model(root / "model")
    return root


@pytest.fixture(scope="module")
def killed(root):
    """A 2-process run whose processes both SIGKILL themselves at step 3 (the last
    checkpoint is at step 2, with batch 2 generated and pending), then resumed."""
    args = cli_args(root / "model", root / "run")
    crashed = launch(args, root / "killed_spy", KILL_AT, root / "jax_cache")
    assert [r.returncode for r in crashed] == [-9, -9], crashed[0].stdout[-3000:]
    shutil.copy(root / "run" / "metrics.jsonl", root / "metrics_at_kill.jsonl")
    for r in launch(args + ["--resume"], root / "resumed_spy", -1, root / "jax_cache"):
        assert r.returncode == 0, r.stdout[-3000:]
    return root


@pytest.fixture(scope="module")
def uninterrupted(root, killed):
    for r in launch(cli_args(root / "model", root / "full"), root / "full_spy", -1,
                    root / "jax_cache"):
        assert r.returncode == 0, r.stdout[-3000:]
    return root / "full"


def one_process_batches(num_batches: int) -> list[list[str]]:
    """Example ids of the first batches of a one-process run with the same seed (the
    job's prompt stream: `experiments.run.build.build`)."""
    task = build_task(TaskSpec(**TASK))
    data = PromptBatchIterator(task.train, PromptDataConfig(batch_size=TASK["prompts_per_step"],
                                                            seed=0))
    return [[ex["id"] for ex in next(data)] for _ in range(num_batches)]


def prompts(row: dict) -> list[str]:
    return [ex for i, ex in enumerate(row["examples"]) if i % TASK["samples_per_prompt"] == 0]


def trained(root: pathlib.Path, k: int) -> list[dict]:
    """Process ``k``'s rows of every learner step that counted: steps before the last
    checkpoint from the killed launch, the rest from the resumed one."""
    before = read_jsonl(root / f"killed_spy.{k}.jsonl")
    return before[:2] + read_jsonl(root / f"resumed_spy.{k}.jsonl")


def test_processes_train_on_their_own_shares_of_the_one_process_batch(killed):
    spies = [trained(killed, k) for k in (0, 1)]
    assert [[r["batch"] for r in s] for s in spies] == [list(range(STEPS))] * 2
    expected = one_process_batches(STEPS)
    for n in range(STEPS):
        # contiguous shares whose union, in order, is the one-process batch
        assert [prompts(s[n]) for s in spies] == [expected[n][:1], expected[n][1:]]
        assert [len(s[n]["responses"]) for s in spies] == [TASK["samples_per_prompt"]] * 2
    # distinct sampling streams (all 6 of 6 rows were identical across processes before)
    seqs = [[tuple(r) for row in s for r in row["responses"]] for s in spies]
    assert seqs[0] != seqs[1]
    rows = read_jsonl(killed / "run" / "metrics.jsonl")
    # 2 processes x 8 rows
    assert [r["batch/num_rows"] for r in rows] == [2.0 * TASK["samples_per_prompt"]] * STEPS
    assert json.loads((killed / "run" / "meta.json").read_text())["process_count"] == 2


def test_advantages_and_metrics_cover_both_processes(killed):
    spies = [trained(killed, k) for k in (0, 1)]
    rows = read_jsonl(killed / "run" / "metrics.jsonl")
    answers = {ex["id"]: str(ex["answer"]) for ex in build_task(TaskSpec(**TASK)).train}
    tok = Tokenizer.from_pretrained(tiny_dir())
    for n, row in enumerate(rows):
        rewards = [r for s in spies for r in s[n]["rewards"]]
        for s in spies:  # the designed model answers one digit, reward 1 when it is right
            for ex, resp, r in zip(s[n]["examples"], s[n]["responses"], s[n]["rewards"]):
                assert r == float(tok.decode(resp[:1]) == answers[ex])
        assert row["reward/mean"] == pytest.approx(np.mean(rewards), abs=1e-12)
        adv = compute_advantages(np.array(rewards, np.float32).reshape(2, TASK["samples_per_prompt"]),
                                 AdvantageConfig(estimator="grpo"))
        np.testing.assert_array_equal(
            np.concatenate([s[n]["advantages"] for s in spies]).astype(np.float32),
            np.asarray(adv).reshape(-1))
    assert any(r["train/update_norm"] > 0 for r in rows), \
        "no step had reward variance: the test would not exercise learning"
    assert rows[-1]["train/param_norm"] != rows[0]["train/param_norm"]
    after = json.loads((killed / "run" / "eval" / "after_rl.json").read_text())
    bench = after["benchmarks"]["arithmetic"]
    assert (bench["num_examples"], bench["num_samples"]) == (2, 8)  # 1 example per process
    with np.load(killed / "run" / "token_samples" / "step_0.npz") as tokens:
        assert tokens["loss_mask"].shape[0] == 2 * TASK["samples_per_prompt"]  # both processes' rows


def test_kill_and_resume_of_both_processes_loses_and_repeats_no_batch(killed):
    at_kill = read_jsonl(killed / "metrics_at_kill.jsonl")
    rows = read_jsonl(killed / "run" / "metrics.jsonl")
    assert [r["batch/id"] for r in at_kill] == [0, 1]
    assert [r["batch/id"] for r in rows] == list(range(STEPS))
    assert rows[:2] == at_kill
    for k in (0, 1):
        before = read_jsonl(killed / f"killed_spy.{k}.jsonl")
        after = read_jsonl(killed / f"resumed_spy.{k}.jsonl")
        assert [r["step"] for r in before] == list(range(KILL_AT))
        assert [r["step"] for r in after] == list(range(2, STEPS))
        # batch 2 was generated before the kill and parked in each process's delay line:
        # the resumed process trains on exactly those rows, with the same advantages
        assert after[0] == before[2]


@pytest.mark.slow
def test_resumed_run_equals_an_uninterrupted_run_bit_for_bit(killed, uninterrupted):
    run = killed / "run"
    assert (run / "metrics.jsonl").read_bytes() == (uninterrupted / "metrics.jsonl").read_bytes()
    for k in (0, 1):
        assert trained(killed, k) == read_jsonl(killed / f"full_spy.{k}.jsonl")
    assert ((run / "eval/after_rl.json").read_bytes()
            == (uninterrupted / "eval/after_rl.json").read_bytes())
    with np.load(run / "token_samples/step_2.npz") as a, \
            np.load(uninterrupted / "token_samples/step_2.npz") as b:
        assert sorted(a) == sorted(b)
        for name in a:
            np.testing.assert_array_equal(a[name], b[name])


@pytest.mark.slow
def test_async_mode_with_two_processes_trains_each_share_once(root):
    """Real async mode (a sampler thread per process): staleness is measured, not
    reproducible, but every step still trains the one-process prompts, split."""
    args = cli_args(root / "model", root / "async", staleness_mode="async")
    for r in launch(args, root / "async_spy", -1, root / "jax_cache"):
        assert r.returncode == 0, r.stdout[-3000:]
    spies = [read_jsonl(root / f"async_spy.{k}.jsonl") for k in (0, 1)]
    expected = one_process_batches(STEPS)
    for n in range(STEPS):
        assert [prompts(s[n]) for s in spies] == [expected[n][:1], expected[n][1:]]
    rows = read_jsonl(root / "async" / "metrics.jsonl")
    assert [r["batch/id"] for r in rows] == list(range(STEPS))
    # num_rows counts the rows of both processes (summed, as in the simulated runs above)
    assert all(r["staleness/inter_max"] <= 1 for r in rows)
    assert [r["batch/num_rows"] for r in rows] == [2.0 * TASK["samples_per_prompt"]] * STEPS


def test_share_bounds_and_split():
    assert [mp.Share(k, 2).bounds(6, "task.prompts_per_step") for k in (0, 1)] == [(0, 3), (3, 6)]
    with pytest.raises(ValueError, match="task.prompts_per_step = 5 must be divisible"):
        mp.Share(0, 2).bounds(5, "task.prompts_per_step")
    assert [mp.Share(k, 3).split(7) for k in range(3)] == [(0, 3), (3, 5), (5, 7)]
    assert [mp.Share(k, 3).split(2) for k in range(3)] == [(0, 1), (1, 2), (2, 2)]
    assert mp.Share(1, 2).take(list("abcd"), "x") == ["c", "d"]


def _minibatch_prompts(indices, group_size, minibatches):
    """The prompts (global indices) of each mini-batch that `make_batch` builds from the
    episodes of the prompts ``indices`` (``group_size`` samples each), padding left out."""
    from entr_jax.types import Trajectory
    from learners.batching import make_batch

    def episode(i):
        return Trajectory(prompt_ids=np.asarray([1000 + i], np.int32),
                          response_ids=np.asarray([1, 2], np.int32),
                          logp_mu=np.zeros(2, np.float32), entropy_mu=np.zeros(2, np.float32),
                          token_version=np.zeros(2, np.int32), loss_mask=np.ones(2, bool),
                          group_id=i)

    trajs = [episode(i) for i in indices for _ in range(group_size)]
    batch, _ = make_batch(trajs, np.zeros(len(trajs)), pad_id=0, num_minibatches=minibatches,
                          num_microbatches=2)
    first = np.asarray(batch.tokens)[..., 0].reshape(minibatches, -1)
    return [[int(x) - 1000 for x in row if x >= 1000] for row in first]


@pytest.mark.parametrize("procs,minibatches,prompts", [(2, 2, 4), (2, 4, 8), (4, 2, 16), (3, 2, 12)])
def test_each_minibatch_holds_the_same_prompts_at_any_process_count(procs, minibatches, prompts):
    # One process: mini-batch j is the j-th of K consecutive chunks of the rollout batch.
    # N processes: each builds its K mini-batches from its own rows and global mini-batch j
    # is the union of the processes' j-th ones (learners.distributed.shard_batch), which
    # must be the same prompts, in the same order. (With contiguous shares, 2 processes
    # and K = 2 gave {0, 1, 4, 5} and {2, 3, 6, 7} for 8 prompts, not {0..3} and {4..7}.)
    group = 2
    one = _minibatch_prompts(mp.Share(0, 1).chunk_indices(prompts, minibatches, "p", "k"), group,
                             minibatches)
    assert one == [[i for i in range(j * prompts // minibatches, (j + 1) * prompts // minibatches)
                    for _ in range(group)] for j in range(minibatches)]
    parts = [_minibatch_prompts(mp.Share(k, procs).chunk_indices(prompts, minibatches, "p", "k"),
                                group, minibatches) for k in range(procs)]
    assert [sum((part[j] for part in parts), []) for j in range(minibatches)] == one
    shares = [mp.Share(k, procs).chunk_indices(prompts, minibatches, "p", "k") for k in range(procs)]
    assert sorted(sum(shares, [])) == list(range(prompts))


def test_chunk_indices_refuse_a_batch_the_processes_cannot_share_per_minibatch():
    assert mp.Share(1, 2).chunk_indices(8, 2, "task.prompts_per_step", "learner.minibatches") == [
        2, 3, 6, 7]
    assert mp.Share(0, 1).chunk_indices(5, 3, "p", "k") == [0, 1, 2, 3, 4]  # one process: any
    with pytest.raises(ValueError, match=r"task.prompts_per_step = 6 must be divisible by the "
                       r"number of processes \(2\) times learner.minibatches \(2\)"):
        mp.Share(0, 2).chunk_indices(6, 2, "task.prompts_per_step", "learner.minibatches")


def test_one_process_helpers_are_identities():
    assert mp.allgather_json({"a": [1.5]}) == [{"a": [1.5]}]
    assert mp.per_process({"x": 1}) == {"x": 1}
    assert mp.own({"x": 1}, "data_state") == {"x": 1}
    with pytest.raises(ValueError, match="'delay_line' was written by 2 process"):
        mp.own({"process_count": 2, "by_process": [{}, {}]}, "delay_line")
    stats = {"batch/num_rows": 3.0, "loss": 0.5}
    assert mp.global_batch_stats(stats) is stats


def test_sampling_seed_offsets_give_other_streams_and_offset_zero_the_one_process_seed():
    from experiments.run.rollouts import sampling_seed

    one_process = int(np.random.default_rng([7, 11, 0, 5]).integers(0, 2**31 - 1))
    assert sampling_seed(7, 5) == sampling_seed(7, 5, 0, 0) == one_process
    seeds = {sampling_seed(7, 5, 0, o) for o in range(4)}
    assert len(seeds) == 4


def test_union_of_trajectory_stats_gives_the_whole_batch_metrics():
    from entr_jax.types import Trajectory
    from experiments.run import rollouts as ro

    def traj(reward, n, version, group, truncated=False):
        return Trajectory(prompt_ids=np.array([1], np.int32),
                          response_ids=np.arange(n, dtype=np.int32),
                          logp_mu=np.zeros(n, np.float32), entropy_mu=np.zeros(n, np.float32),
                          token_version=np.full(n, version, np.int32),
                          loss_mask=np.ones(n, bool), reward=reward, group_id=group,
                          info={"truncated": truncated})

    # two prompts of two samples; process 0 holds one sample of each, process 1 the others
    trajs = [traj(1.0, 3, 2, 0), traj(0.0, 5, 1, 1, True), traj(0.5, 2, 2, 0), traj(0.0, 4, 0, 1)]
    whole = ro.rollout_metrics(ro.RolloutBatch(7, 2, trajs, first_version=0,
                                               entropy_estimated_tokens=5), version=3)
    halves = [ro.trajectory_stats(trajs[:2], 3, 2), ro.trajectory_stats(trajs[2:], 3, 3)]
    union = {k: halves[0][k] + halves[1][k] for k in halves[0]}
    assert ro.metrics_from_stats(7, 2, union, 3, first_version=0) == whole
    assert whole["reward/mean"] == 0.375 and whole["response/length_max"] == 5
    assert whole["reward/zero_variance_group_frac"] == 0.5  # group 1: rewards 0 and 0
    assert whole["sampler/entropy_estimated_tokens"] == 5
    assert whole["sampler/entropy_estimated_frac"] == 5 / 14
    assert whole["staleness/intra_planned"] == 2 and whole["staleness/inter_planned"] == 1
    assert whole["staleness/inter_hist"] == [0, 2, 1, 1]  # inter = 3 - last version


class _Dev:
    def __init__(self, process_index):
        self.process_index = process_index


class _Mesh:
    def __init__(self, owners, data, fsdp, tensor):
        self.devices = np.array([_Dev(p) for p in owners], object).reshape(data, fsdp, tensor)
        self.shape = {"data": data, "fsdp": fsdp, "tensor": tensor}


def test_local_row_shards_counts_this_process_rows_and_refuses_shared_rows():
    from learners.distributed import local_row_shards

    assert local_row_shards(_Mesh([0, 0, 1, 1], 2, 2, 1)) == 2
    assert local_row_shards(_Mesh([0, 0, 1, 1], 2, 1, 2)) == 1  # tensor pairs within a process
    with pytest.raises(ValueError, match="row shard 0 spans processes \\[0, 1\\]"):
        local_row_shards(_Mesh([0, 1, 0, 1], 2, 1, 2))  # a tensor pair across processes
    with pytest.raises(ValueError, match="unequal numbers of row shards \\[3, 1\\]"):
        local_row_shards(_Mesh([0, 0, 0, 1], 4, 1, 1))


def test_initialize_selects_gloo_for_cpu_collectives_and_checks_the_environment(monkeypatch):
    import jax

    from learners import distributed

    calls = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: calls.append(kw))
    previous = jax.config.jax_cpu_collectives_implementation
    jax.config.update("jax_cpu_collectives_implementation", None)
    try:
        env = {"ENTR_COORDINATOR_ADDRESS": "127.0.0.1:1234", "ENTR_NUM_PROCESSES": "2",
               "ENTR_PROCESS_ID": "1"}
        assert distributed.initialize(env) is True
        assert jax.config.jax_cpu_collectives_implementation == "gloo"
        assert calls == [dict(coordinator_address="127.0.0.1:1234", num_processes=2,
                              process_id=1)]
        assert distributed.initialize({}) is False
        with pytest.raises(ValueError, match="missing"):
            distributed.initialize({"ENTR_NUM_PROCESSES": "2"})
        with pytest.raises(ValueError, match="ENTR_PROCESS_ID must be in \\[0, 2\\)"):
            distributed.initialize(dict(env, ENTR_PROCESS_ID="2"))
    finally:
        jax.config.update("jax_cpu_collectives_implementation", previous)
    assert len(calls) == 1
