"""Where a run's time goes: wall and CPU seconds per phase, with JAX compilation apart.

`PhaseClock` times the phases of a job (``sft``, ``eval``, ``rl``) and listens to JAX's
compilation events (`jax.monitoring`: tracing, lowering to MLIR and the XLA backend
compile of every jit cache miss, on any thread). The split it reports adds up to the
run's wall time::

    total_s = sft_s + eval_s + rl_s + compile_s + other_s

where ``compile_s`` is the wall time during which some compilation ran (the union of the
compile events' time spans, so nested traces are counted once), each phase's figure is
its wall time minus the compilation inside it, and ``other_s`` is the rest (start-up
after the imports, data and task build, model init, checkpoints outside RL, exports,
files). ``cpu`` gives the process CPU seconds (user + system, every thread) per phase,
a figure that the load of a shared machine distorts less than wall time.

Sub-phases (e.g. the RL loop's sampling, learning and checkpoint time) are accumulated
with `PhaseClock.add` and reported as they are (they include their compilation).
A resumed run continues the figures saved in its checkpoint (`PhaseClock.state_dict`).
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from typing import Any, Iterator

from jax import monitoring

__all__ = ["COMPILE_EVENTS", "PHASES", "PhaseClock", "format_split"]

# jax._src.dispatch: JAXPR_TRACE_EVENT, JAXPR_TO_MLIR_MODULE_EVENT, BACKEND_COMPILE_EVENT
COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
                  "/jax/core/compile/jaxpr_to_mlir_module_duration",
                  "/jax/core/compile/backend_compile_duration")
_BACKEND_COMPILE = COMPILE_EVENTS[2]
_CACHE_HIT = "/jax/compilation_cache/cache_hits"  # a persistent-cache hit (jax._src.compiler)
PHASES = ("sft", "eval", "rl")


def _union_length(spans: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Length of the union of ``spans`` clipped to ``[lo, hi]`` (seconds)."""
    total, end = 0.0, lo
    for s, e in sorted(spans):
        s, e = max(s, end), min(e, hi)
        if e > s:
            total += e - s
            end = e
    return total


class PhaseClock:
    """Wall/CPU seconds per phase and JAX compilation time of one job (see the module
    docstring). Call `start` once, `stop` at the end (or on an error)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._compile_spans: list[tuple[float, float]] = []
        self._phase_spans: dict[str, list[tuple[float, float]]] = {p: [] for p in PHASES}
        self._open: dict[str, tuple[float, float]] = {}  # phase -> (wall, CPU) at its start
        self._cpu = collections.defaultdict(float)
        self.sub = collections.defaultdict(float)  # sub-phase wall seconds (`add`)
        self.counts = collections.Counter()  # anything counted during the run (`count`)
        self.compiled = collections.Counter()  # backend compiles per function name
        self._base: dict[str, Any] = {}
        self._t0 = self._cpu0 = None
        self._listening = False

    # ------------------------------------------------------------------ listening
    def _on_span(self, event: str, start: float, end: float, **kwargs) -> None:
        if event not in COMPILE_EVENTS:
            return
        with self._lock:
            self._compile_spans.append((start, end))
            if event == _BACKEND_COMPILE:
                self.compiled[str(kwargs.get("fun_name", "?"))] += 1

    def _on_event(self, event: str, **kwargs) -> None:
        if event == _CACHE_HIT:
            with self._lock:
                self.counts["compile_cache_hits"] += 1

    def start(self) -> None:
        """Start the clock (wall and CPU) and listen to JAX's compile events."""
        self._t0, self._cpu0 = time.time(), time.process_time()
        if not self._listening:
            monitoring.register_event_time_span_listener(self._on_span)
            monitoring.register_event_listener(self._on_event)
            self._listening = True

    def stop(self) -> None:
        """Stop listening (idempotent)."""
        if self._listening:
            monitoring.unregister_event_time_span_listener(self._on_span)
            monitoring.unregister_event_listener(self._on_event)
            self._listening = False

    # ------------------------------------------------------------------ recording
    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time a block as phase ``name`` (one of `PHASES`; blocks must not nest)."""
        if name not in PHASES:
            raise ValueError(f"PhaseClock.phase: unknown phase {name!r}; phases: {PHASES}")
        t, c = time.time(), time.process_time()
        self._open[name] = (t, c)
        try:
            yield
        finally:
            self._phase_spans[name].append((t, time.time()))
            self._cpu[name] += time.process_time() - c
            del self._open[name]

    def add(self, name: str, seconds: float) -> None:
        """Accumulate ``seconds`` of wall time under sub-phase ``name`` (e.g. ``rl/sample_s``)."""
        self.sub[name] += float(seconds)

    def count(self, name: str, n: int = 1) -> None:
        """Add ``n`` to counter ``name`` (e.g. evaluation episodes)."""
        self.counts[name] += int(n)

    # ------------------------------------------------------------------ reporting
    def split(self, total_s: float | None = None) -> dict[str, Any]:
        """The split so far (this session plus a restored `state_dict`).

        Args:
          total_s: the run's wall seconds to split (e.g. the summary's ``wall_clock_s``);
            default: the time since `start` plus the restored total.
        Returns:
          ``{"wall": {sft_s, eval_s, rl_s, compile_s, other_s, total_s}, "cpu": {sft_s,
          eval_s, rl_s, total_s}, "sub": {...}, "counts": {...}, "compiles": int,
          "compiles_by_function": {name: n}}``; ``wall`` adds up to ``total_s`` exactly
          (``other_s`` is the remainder; it is negative only if ``total_s`` was given
          smaller than the phases it contains).
        """
        if self._t0 is None:
            raise RuntimeError("PhaseClock.split before start")
        now = time.time()
        base = self._base
        bw, bc = base.get("wall", {}), base.get("cpu", {})
        with self._lock:
            spans = list(self._compile_spans)
            compiled = collections.Counter(self.compiled)
        # a phase still open (a checkpoint's figures are taken inside the RL phase) counts
        # up to now, so a resumed run continues it instead of moving it to other_s
        open_ = dict(self._open)
        cpu_now = time.process_time()
        wall: dict[str, float] = {}
        for p in PHASES:
            phase_spans = self._phase_spans[p] + ([(open_[p][0], now)] if p in open_ else [])
            own = sum(e - s for s, e in phase_spans)
            inside = sum(_union_length(spans, s, e) for s, e in phase_spans)
            wall[f"{p}_s"] = bw.get(f"{p}_s", 0.0) + own - inside
        wall["compile_s"] = bw.get("compile_s", 0.0) + _union_length(spans, self._t0, now)
        if total_s is None:
            total_s = bw.get("total_s", 0.0) + now - self._t0
        wall["other_s"] = total_s - sum(wall[k] for k in ("sft_s", "eval_s", "rl_s", "compile_s"))
        wall["total_s"] = float(total_s)
        cpu = {f"{p}_s": bc.get(f"{p}_s", 0.0) + self._cpu[p]
               + (cpu_now - open_[p][1] if p in open_ else 0.0) for p in PHASES}
        cpu["total_s"] = bc.get("total_s", 0.0) + cpu_now - self._cpu0
        compiled.update(base.get("compiles_by_function", {}))
        sub = collections.Counter(base.get("sub", {}))
        sub.update(self.sub)
        counts = collections.Counter(base.get("counts", {}))
        counts.update(self.counts)
        return {"wall": wall, "cpu": cpu, "sub": dict(sub), "counts": dict(counts),
                "compiles": int(sum(compiled.values())),
                "compiles_by_function": dict(compiled.most_common())}

    def state_dict(self, total_s: float | None = None) -> dict[str, Any]:
        """JSON-able figures so far (saved with a checkpoint)."""
        return self.split(total_s)

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Continue from the figures of an earlier session (`state_dict`; None: nothing)."""
        self._base = dict(state or {})

    @property
    def restored_total_s(self) -> float:
        """Wall seconds of the earlier sessions this clock continues (0 when none)."""
        return float(self._base.get("wall", {}).get("total_s", 0.0))


def format_split(wall: dict[str, float], compilations: int, cpu_s: float) -> str:
    """One line for the printed summary from ``time/phases`` (``wall``), the number of
    compilations and the process CPU seconds, e.g. ``time 301 s = SFT 120 + eval 40 + RL
    110 + compile 25 + other 6 (57 compilations; process CPU 560 s)``."""
    return (f"time {wall['total_s']:.0f} s = SFT {wall['sft_s']:.0f} + eval "
            f"{wall['eval_s']:.0f} + RL {wall['rl_s']:.0f} + compile {wall['compile_s']:.0f} + "
            f"other {wall['other_s']:.0f} ({compilations} compilations; process CPU "
            f"{cpu_s:.0f} s)")
