"""What a run is doing, one plain line per phase on stderr (flushed), on a terminal and in a log file alike.

``draftbench run`` says when it loads the target (and how long converting the embedded GGUF took), when each entry
starts and ends compiling its graphs (the entry's label, its place in the list, the seconds so far, the inductor
cache's outcome and, from the second run on, the seconds the same entry compiled last time), a heartbeat line every
:data:`HEARTBEAT_S` seconds while an entry warms up or a graph compiles, the warm-up's end, and one line per
measured question when stderr is not a terminal (a terminal gets tqdm's bar). ``--no-progress`` silences all of it.

Compile seconds per entry are kept in ``timings.json`` in the compiled runner's cache folder
(:attr:`harness.engine.runtime.CompiledRunner.cache_dir`, one per torch version, model, dtype, device type and
linear kernel), ``{"entries": {label: seconds}}``, so "last time" compares like with like and ``draftbench cache
clear`` forgets it with the artefacts.

Every line starts with the seconds since the run started (``[  12s]``); the clock is injectable so that tests check
the lines without timing anything.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

from harness.engine.runtime import CompileEvent

HEARTBEAT_S = 20.0  # a line at least this often while an entry warms up or compiles (no silent minute)
TIMINGS_FILE = "timings.json"


def read_compile_entries(cache_dir: Path) -> dict[str, dict[str, float]]:
    """``{label: {"seconds": s, "graphs": n, "loaded": m}}`` of the last run that compiled each entry in
    ``cache_dir`` (``loaded``: how many of its ``graphs`` came whole from the compile cache); {} when none or
    unreadable. A record of an older draftbench (a bare number of seconds) reads as ``{"seconds": s}``."""
    try:
        entries = json.loads((Path(cache_dir) / TIMINGS_FILE).read_text()).get("entries", {})
    except (OSError, ValueError, AttributeError):
        return {}
    if not isinstance(entries, dict):
        return {}
    out: dict[str, dict[str, float]] = {}
    for label, v in entries.items():
        if isinstance(v, (int, float)):
            out[str(label)] = {"seconds": float(v)}
        elif isinstance(v, dict) and isinstance(v.get("seconds"), (int, float)):
            out[str(label)] = {k: float(x) for k, x in v.items() if isinstance(x, (int, float))}
    return out


def read_compile_timings(cache_dir: Path) -> dict[str, float]:
    """``{label: compile seconds}`` of the last run that compiled in ``cache_dir``; {} when none (or unreadable)."""
    return {label: e["seconds"] for label, e in read_compile_entries(cache_dir).items()}


def write_compile_timing(cache_dir: Path, label: str, seconds: float, graphs: int = 0, loaded: int = 0) -> None:
    """Store ``label``'s compile seconds, graphs and graphs loaded from the cache in ``cache_dir/timings.json``
    (replaced whole; a failure to write is no reason to stop a run, so it is ignored)."""
    entries = read_compile_entries(cache_dir) | {label: {"seconds": round(seconds, 1), "graphs": graphs,
                                                         "loaded": loaded}}
    path = Path(cache_dir) / TIMINGS_FILE
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{TIMINGS_FILE}.{os.getpid()}")
        tmp.write_text(json.dumps({"entries": entries}, indent=1, sort_keys=True))
        os.replace(tmp, path)


class Progress:
    """The run's progress lines (see the module docstring). ``enabled`` False: silent. ``stream``: default stderr;
    ``clock``: seconds, default :func:`time.monotonic`; ``heartbeat_s``: None disables the heartbeat thread (tests
    call :meth:`beat` themselves)."""

    def __init__(self, enabled: bool = True, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic, heartbeat_s: float | None = HEARTBEAT_S):
        self.enabled = enabled
        self.stream = stream
        self.clock = clock
        self.heartbeat_s = heartbeat_s
        self.t0 = clock()
        self.entry = ""               # the entry whose graphs compile now ("vanilla@compiled (1/4)")
        self._doing: list[tuple[str, float]] = []  # what the heartbeat says goes on (and since when), innermost last
        self._stop: threading.Event | None = None
        self._lock = threading.Lock()

    def say(self, text: str) -> None:
        if not self.enabled:
            return
        with self._lock:
            print(f"[{self.clock() - self.t0:5.0f}s] {text}", file=self.stream or sys.stderr, flush=True)

    @contextlib.contextmanager
    def phase(self, text: str, done: str = "done") -> Iterator[None]:
        """A line when ``text`` starts and one when it ends, with its seconds."""
        self.say(f"{text} ...")
        t0 = self.clock()
        yield
        self.say(f"{text}: {done} in {self.clock() - t0:.1f} s")

    # ---- compilation ----------------------------------------------------------------------------------------------
    def on_compile(self, event: CompileEvent) -> None:
        """A compiled runner's :attr:`~harness.engine.runtime.CompiledRunner.on_compile`: a line when a graph starts
        compiling (then heartbeat lines) and one when it is done, compiled or loaded from the compile cache; the one
        line saying why an unusable cache folder was removed."""
        if event.phase == "reset":
            self.say(f"  {self.entry}: {event.note}")
        elif event.phase == "start":
            self.say(f"  {self.entry}: compiling graph {event.graph + 1} of its runtime ...")
            self._begin(f"compiling graph {event.graph + 1}", self.clock() - event.seconds)
        else:
            self._end()
            if event.loaded:
                self.say(f"  {self.entry}: graph {event.graph} loaded from cache in {event.seconds:.1f} s")
            else:
                cache = f", inductor cache {event.cache}" if event.cache else ""
                self.say(f"  {self.entry}: graph {event.graph} compiled in {event.seconds:.1f} s{cache}")

    def beat(self) -> None:
        """The heartbeat line (every ``heartbeat_s`` while an entry warms up or a graph compiles)."""
        if self._doing:
            what, since = self._doing[-1]
            self.say(f"  {self.entry}: still {what} ({self.clock() - since:.0f} s so far)")

    def _begin(self, what: str, since: float) -> None:
        self._doing.append((what, since))
        if not self.enabled or self.heartbeat_s is None or self._stop is not None:
            return
        stop = self._stop = threading.Event()

        def loop() -> None:
            while not stop.wait(self.heartbeat_s):
                self.beat()

        threading.Thread(target=loop, name="draftbench-heartbeat", daemon=True).start()

    def _end(self) -> None:
        if self._doing:
            self._doing.pop()
        if not self._doing and self._stop is not None:
            self._stop.set()
            self._stop = None

    @contextlib.contextmanager
    def warm_up(self, label: str, place: str, runner: Any) -> Iterator[None]:
        """Around one entry's warm-up: a start line (with last run's compile seconds when known), an end line with
        the graphs and seconds its warm-up compiled; stores those seconds for the next run (compiled runners)."""
        cache_dir = getattr(runner, "cache_dir", None)
        last = read_compile_timings(cache_dir).get(label) if cache_dir is not None else None
        self.entry = f"{label} ({place})"
        before = (runner.graphs, runner.compile_s, getattr(runner, "loaded", 0))
        hint = f"; last time it compiled for {last:.0f} s" if last is not None else ""
        compiled = "compiling and " if runner.runtime == "compiled" else ""
        self.say(f"{self.entry}: {compiled}warm-up{hint} ...")
        t0 = self.clock()
        self._begin("warming up", t0)
        try:
            yield
        finally:
            while self._doing:  # a compile that raised never said "end"
                self._end()
        graphs, seconds = runner.graphs - before[0], runner.compile_s - before[1]
        loaded = getattr(runner, "loaded", 0) - before[2]
        what = ""
        if runner.runtime == "compiled":
            what = (f", {graphs} new graph(s) ({loaded} loaded from cache, {graphs - loaded} compiled) in "
                    f"{seconds:.1f} s" if loaded else f", {graphs} new graph(s) compiled in {seconds:.1f} s")
        self.say(f"{self.entry}: warm-up done in {self.clock() - t0:.1f} s{what}")
        if cache_dir is not None and graphs:
            write_compile_timing(cache_dir, label, seconds, graphs, loaded)


class QuestionLines:
    """The measured questions of one cell as plain lines (for a log file: stderr is not a terminal), iterable like
    the tqdm bar it replaces; :meth:`set_postfix` keeps the last speed shown in the next line."""

    def __init__(self, items: list, desc: str, progress: Progress):
        self.items, self.desc, self.progress = items, desc, progress
        self.postfix = ""

    def set_postfix(self, **values: Any) -> None:
        self.postfix = " ".join(f"{k}={v}" for k, v in values.items())

    def __iter__(self) -> Iterator:
        n = len(self.items)
        self.progress.say(f"{self.desc}: {n} question(s) ...")
        for i, item in enumerate(self.items, 1):
            yield item
            self.progress.say(f"{self.desc}: {i}/{n} {self.postfix}".rstrip())
