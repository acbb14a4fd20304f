"""Command lines that start an SGLang fleet for one HF checkpoint directory.

One ``python -m sglang.launch_server`` process per group of ``tp_size`` GPUs (selected
with ``CUDA_VISIBLE_DEVICES``), on consecutive ports from ``base_port``, bound to
loopback unless ``host`` says otherwise, optionally behind one
``python -m sglang_router.launch_router``. The fleet client is then pointed at
`server_urls` and, with a router, `router_url` (see ``docs/sglang.md``). Requires
``pip install -e .[sglang]`` on the GPU hosts (``.[router]`` for the router); this module
itself only builds (and, with ``--run``, starts) the commands.

Usage::

    python -m samplers.sglang_launch --model-path /ckpt/qwen --gpu-ids 0 1 2 3   # print
    python -m samplers.sglang_launch --model-path /ckpt/qwen --gpu-ids 0 1 --run  # start
    python -m samplers.sglang_launch --model-path /ckpt/qwen --api-key env:SGLANG_API_KEY
    python -m samplers.sglang_launch --model-path /ckpt/llama --device cpu --run \
        --extra-args "--max-total-tokens 4096 --disable-overlap-schedule"

``--extra-args`` takes one string of SGLang flags (split as a shell would), and may be
given more than once; everything after a bare ``--`` is passed on too. With ``--run``,
SIGTERM or Ctrl-C stops every process the launch started (`samplers.sglang_procs`).

The API key never appears on a command line or in what is printed: ``api_key`` names
where it is read from (``env:NAME`` or ``file:PATH``), the launcher writes it to a file
only the user can read (``<secrets_dir>/sglang_api_key.json``), and every command reads it
from there: the servers with SGLang's ``--config FILE`` (a JSON file of server flags), the
router through ``python -m samplers.sglang_launch router --key-file FILE ...``, which sets
the router's ``api_key`` in-process before starting it.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import shlex
import signal
import sys
import tempfile

from samplers.sglang_config import check_api_key_source, read_api_key
from samplers.sglang_procs import LaunchCommand, LocalServers

KEY_FILE = "sglang_api_key.json"
DTYPES = ("bfloat16", "float16", "float32")


@dataclasses.dataclass(frozen=True)
class SGLangLaunchConfig:
    """What to launch.

    Attributes:
      model_path: HF checkpoint directory (config.json + safetensors + tokenizer).
      gpu_ids: GPU indices on this host to use, split into servers of ``tp_size`` GPUs.
      tp_size: tensor-parallel GPUs per server (``--tp-size``).
      host: address the servers bind to; loopback by default. Any other address
        requires ``api_key``.
      base_port: port of the first server; server i listens on ``base_port + i``.
      api_key: where the key the servers and the router require is read from
        (clients send ``Authorization: Bearer <key>``): ``env:NAME`` or ``file:PATH``
        (`samplers.sglang_config.read_api_key`); empty = no key.
      secrets_dir: where the key file the commands read is written (made private, 0700;
        the file 0600); empty = a new private temporary directory.
      mem_fraction_static: ``--mem-fraction-static`` when set (fraction of GPU memory
        for weights + KV cache).
      deterministic: add ``--enable-deterministic-inference`` (makes ``sampling_seed``
        effective, at some throughput cost).
      router_port: when set, also start ``sglang_router.launch_router`` (PyPI
        ``sglang-router``, ``pip install -e .[router]``) on this port over all servers; point
        the client at it with ``SGLangFleetConfig.router_url`` (`router_url`) and keep the
        servers in ``server_urls``.
      router_metrics_port: the router's Prometheus port (``--prometheus-port``, bound to
        ``host``); None = ``router_port + 1``. The router's own default, 0.0.0.0:29000,
        would collide with a router on port 29000 or a second router on the host.
      dtype: ``--dtype`` of every server. Always passed: exports say float32 in their
        config, which SGLang's ``--dtype auto`` serves as float16, and float16 serving on
        SGLang's CPU build is numerically wrong (mean |log-prob error| 2.9 nats measured,
        ``docs/sglang.md``); float32 crashes its CPU RMSNorm kernel. bfloat16 by default.
      device: ``cuda`` (one server per ``tp_size`` GPUs of ``gpu_ids``, selected with
        ``CUDA_VISIBLE_DEVICES``) or ``cpu`` (``--device cpu``, one server per entry of
        ``gpu_ids``, which then only counts servers; SGLang's CPU engine needs Intel AMX
        and its CPU kernel package, and 0.5.23 needs ``--attention-backend
        torch_native``, added unless ``extra_args`` names a backend).
      extra_args: appended verbatim to every server command.
      python: interpreter used for the commands; default ``$ENTR_SGLANG_PYTHON`` (an
        interpreter with SGLang installed, e.g. a virtual environment of its own), else
        ``python``.
    """

    model_path: str
    gpu_ids: tuple[int, ...] = (0,)
    tp_size: int = 1
    host: str = "127.0.0.1"
    base_port: int = 30000
    api_key: str = ""
    secrets_dir: str = ""
    mem_fraction_static: float | None = None
    deterministic: bool = False
    router_port: int | None = None
    router_metrics_port: int | None = None
    dtype: str = "bfloat16"
    device: str = "cuda"
    extra_args: tuple[str, ...] = ()
    python: str = dataclasses.field(
        default_factory=lambda: os.environ.get("ENTR_SGLANG_PYTHON") or "python")

    def __post_init__(self):
        if not self.model_path:
            raise ValueError("SGLangLaunchConfig.model_path must be a non-empty path")
        if not self.gpu_ids or len(set(self.gpu_ids)) != len(self.gpu_ids) or min(self.gpu_ids) < 0:
            raise ValueError(
                f"SGLangLaunchConfig.gpu_ids must be distinct indices >= 0, got {self.gpu_ids}")
        if self.tp_size < 1 or len(self.gpu_ids) % self.tp_size:
            raise ValueError(
                f"SGLangLaunchConfig.tp_size ({self.tp_size}) must be >= 1 and divide "
                f"len(gpu_ids) ({len(self.gpu_ids)})")
        if not 1024 <= self.base_port <= 65535 - len(self.gpu_ids):
            raise ValueError(f"SGLangLaunchConfig.base_port out of range: {self.base_port}")
        if self.router_port is not None and not 1024 <= self.router_port <= 65535:
            raise ValueError(f"SGLangLaunchConfig.router_port out of range: {self.router_port}")
        if self.router_port is not None and self.base_port <= self.router_port < self.base_port + self.num_servers:
            raise ValueError("SGLangLaunchConfig.router_port collides with a server port")
        if self.router_metrics_port is not None and self.router_port is None:
            raise ValueError("SGLangLaunchConfig.router_metrics_port needs router_port")
        if self.router_port is not None:
            metrics = self.metrics_port
            if not 1024 <= metrics <= 65535 or metrics == self.router_port or \
                    self.base_port <= metrics < self.base_port + self.num_servers:
                raise ValueError(
                    f"SGLangLaunchConfig.router_metrics_port ({metrics}) must be a free port in "
                    "[1024, 65535], not the router's or a server's")
        if self.mem_fraction_static is not None and not 0 < self.mem_fraction_static < 1:
            raise ValueError(
                f"SGLangLaunchConfig.mem_fraction_static must be in (0, 1), got {self.mem_fraction_static}")
        if self.dtype not in DTYPES:
            raise ValueError(f"SGLangLaunchConfig.dtype must be one of {DTYPES}, got "
                             f"{self.dtype!r} (auto would serve a float32 export as float16)")
        if self.device not in ("cuda", "cpu"):
            raise ValueError(f"SGLangLaunchConfig.device must be 'cuda' or 'cpu', got {self.device!r}")
        check_api_key_source(self.api_key, "SGLangLaunchConfig.api_key")
        if not _is_loopback(self.host) and not self.api_key:
            raise ValueError(
                f"SGLangLaunchConfig.api_key is required when host ({self.host}) is not loopback")

    @property
    def num_servers(self) -> int:
        return len(self.gpu_ids) // self.tp_size

    @property
    def metrics_port(self) -> int:
        """The router's Prometheus port (``router_metrics_port`` or ``router_port + 1``)."""
        if self.router_metrics_port is not None:
            return self.router_metrics_port
        return (self.router_port or 0) + 1


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _client_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "::") else host


def server_urls(cfg: SGLangLaunchConfig) -> tuple[str, ...]:
    """Base URLs of the servers, for ``SGLangFleetConfig.server_urls``."""
    return tuple(f"http://{_client_host(cfg.host)}:{cfg.base_port + i}" for i in range(cfg.num_servers))


def router_url(cfg: SGLangLaunchConfig) -> str | None:
    """The router's base URL, for ``SGLangFleetConfig.router_url`` (None without a router)."""
    if cfg.router_port is None:
        return None
    return f"http://{_client_host(cfg.host)}:{cfg.router_port}"


def write_key_file(cfg: SGLangLaunchConfig) -> str | None:
    """Read the key ``cfg.api_key`` names and write it, as SGLang's ``--config`` JSON
    (``{"api_key": ...}``), to ``<secrets_dir>/sglang_api_key.json`` with mode 0600;
    returns its path (None without a key).

    Raises:
      ValueError: the key cannot be read (naming the variable or file, never the key).
    """
    key = read_api_key(cfg.api_key, "SGLangLaunchConfig.api_key")
    if key is None:
        return None
    root = cfg.secrets_dir or tempfile.mkdtemp(prefix="entr-sglang-")
    os.makedirs(root, mode=0o700, exist_ok=True)
    os.chmod(root, 0o700)  # also a folder that was there before
    path = os.path.join(root, KEY_FILE)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"api_key": key}, f)
    os.chmod(path, 0o600)
    return path


def server_commands(cfg: SGLangLaunchConfig, key_file: str | None = None) -> list[LaunchCommand]:
    """One ``sglang.launch_server`` command per server; with ``key_file`` (`write_key_file`)
    the servers read their key from it (``--config``)."""
    cmds = []
    for i in range(cfg.num_servers):
        gpus = cfg.gpu_ids[i * cfg.tp_size:(i + 1) * cfg.tp_size]
        argv = [cfg.python, "-m", "sglang.launch_server", "--model-path", cfg.model_path,
                "--host", cfg.host, "--port", str(cfg.base_port + i), "--tp-size", str(cfg.tp_size),
                "--dtype", cfg.dtype]
        if cfg.device == "cpu":
            argv += ["--device", "cpu"]
            if not any(a.startswith("--attention-backend") for a in cfg.extra_args):
                argv += ["--attention-backend", "torch_native"]
        if key_file:
            argv += ["--config", key_file]
        if cfg.mem_fraction_static is not None:
            argv += ["--mem-fraction-static", str(cfg.mem_fraction_static)]
        if cfg.deterministic:
            argv.append("--enable-deterministic-inference")
        argv += list(cfg.extra_args)
        env = ({"CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus))} if cfg.device == "cuda"
               else {"SGLANG_USE_CPU_ENGINE": "1"})  # SGLang's CPU-server docs require it
        cmds.append(LaunchCommand(env=env, argv=tuple(argv)))
    return cmds


def router_command(cfg: SGLangLaunchConfig, key_file: str | None = None) -> LaunchCommand | None:
    """The router's command, or None without ``router_port``: ``sglang_router.launch_router``,
    or with ``key_file`` this module's ``router`` entry, which reads the key from it (the
    router checks it and passes it on to the workers it was started with)."""
    if cfg.router_port is None:
        return None
    start = ([cfg.python, "-m", "samplers.sglang_launch", "router", "--key-file", key_file]
             if key_file else [cfg.python, "-m", "sglang_router.launch_router"])
    argv = start + ["--worker-urls", *server_urls(cfg), "--host", cfg.host,
                    "--port", str(cfg.router_port), "--prometheus-host", cfg.host,
                    "--prometheus-port", str(cfg.metrics_port)]
    return LaunchCommand(env={}, argv=tuple(argv))


def all_commands(cfg: SGLangLaunchConfig, key_file: str | None = None) -> list[LaunchCommand]:
    """Servers first, then the router (if any)."""
    router = router_command(cfg, key_file)
    return server_commands(cfg, key_file) + ([router] if router else [])


def run_router(argv: list[str]) -> int:
    """``router --key-file FILE ROUTER_ARGS...``: start ``sglang-router`` with
    ``ROUTER_ARGS`` and the API key of ``FILE`` (`write_key_file`), set in-process."""
    from sglang_router.launch_router import launch_router, parse_router_args

    if "--key-file" not in argv or argv.index("--key-file") + 1 >= len(argv):
        raise SystemExit("usage: python -m samplers.sglang_launch router --key-file FILE ...")
    i = argv.index("--key-file")
    with open(argv[i + 1], encoding="utf-8") as f:
        key = json.load(f)["api_key"]
    args = parse_router_args(argv[:i] + argv[i + 2:])
    args.api_key = key
    launch_router(args)
    return 0


def split_extra_args(args: list[str]) -> tuple[list[str], tuple[str, ...]]:
    """``(the other arguments, the SGLang flags)`` of a command line: each
    ``--extra-args STRING`` (or ``--extra-args=STRING``) is split as a shell would split
    it, and everything after a bare ``--`` is taken as it is.

    Raises:
      SystemExit: ``--extra-args`` without a value.
    """
    rest, extra = [], []
    if "--" in args:
        extra_tail = args[args.index("--") + 1:]
        args = args[:args.index("--")]
    else:
        extra_tail = []
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--extra-args":
            if i + 1 >= len(args):
                raise SystemExit("--extra-args needs a value: one string of SGLang flags, e.g. "
                                 '--extra-args "--max-total-tokens 4096 --disable-overlap-schedule"')
            extra += shlex.split(args[i + 1])
            i += 2
            continue
        if a.startswith("--extra-args="):
            extra += shlex.split(a.split("=", 1)[1])
        else:
            rest.append(a)
        i += 1
    return rest, tuple(extra + extra_tail)


def main(argv: list[str] | None = None) -> int:
    """CLI: print the commands (default) or start them and wait (``--run``; SIGTERM or
    Ctrl-C stops every process it started); ``router`` starts the router with its key
    file (`run_router`)."""
    import tyro

    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["router"]:
        return run_router(args[1:])
    run = "--run" in args
    args, extra = split_extra_args([a for a in args if a != "--run"])
    cfg = tyro.cli(SGLangLaunchConfig, args=args)
    cfg = dataclasses.replace(cfg, extra_args=tuple(cfg.extra_args) + extra)
    key_file = write_key_file(cfg)
    cmds = all_commands(cfg, key_file)
    for c in cmds:
        print(c.shell())
    router = f", router_url={router_url(cfg)!r}" if cfg.router_port is not None else ""
    key = f", api_key=<the key of {cfg.api_key}>" if cfg.api_key else ""
    print(f"# fleet client: SGLangFleetConfig(server_urls={server_urls(cfg)!r}{router}{key}, "
          "...)", flush=True)
    if not run:
        return 0
    urls = list(server_urls(cfg)) + [None] * (len(cmds) - cfg.num_servers)
    servers = LocalServers(cmds, urls)

    def on_sigterm(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        servers.start()
        return servers.wait()
    except KeyboardInterrupt:
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
        servers.stop()


if __name__ == "__main__":
    raise SystemExit(main())
