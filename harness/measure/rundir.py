"""A run directory (``<output_dir>/<run_id>/``): the names of its files, strict JSON text, atomic writes, and the
manifest (its one reader, its one writer and its schema).

The files of a run directory::

    manifest.json               what was run, on what, by whom (MANIFEST_FILE; schema below), written once by the
                                runner before the first question
    records.jsonl               one measured turn per line (RECORDS_FILE; harness.measure.records); a data-parallel
                                run's process r writes records.rank<r>.jsonl (records_file_name); readers take every
                                records*.jsonl (RECORDS_GLOB)
    load.jsonl                  a run with load levels (config ``load``) has these instead: one row per request
                                (LOAD_FILE; harness.run.load writes a level's rows together, harness.measure.load)
    tables/, plots/             what ``draftbench report`` rebuilds from the records (harness.measure.report);
                                tables/summary.md (SUMMARY_MD) is also copied by ``draftbench baseline save``
    .lock                       held (flock) by the one process that writes records into the run (LOCK_FILE,
                                :class:`RunLock`); it says who holds it

The manifest, a JSON object (``harness.run.runner.build_manifest`` writes it; readers never require a key but
``config``, which ``--resume`` needs)::

    run_id, created, command        the run directory's name, ISO time, the command line
    git_hash, git_dirty             harness.measure.env.git_info() (None outside a git checkout)
    versions                        {python, torch, transformers, draftbench, ...}
    device                          harness.measure.env.device_info() of the target's device
    config, config_digest           the run configuration (RunConfig.to_dict()) and its digest
    target                          {name, path, dtype, model_type, attn_implementation, devices, num_parameters,
                                    source}
    suites                          {name: {version, source, sha256, questions}} (resume checks sha256)
    methods                         {label: the method's describe()}
    runtimes                        {runtime: how it calls the target}
    processes                       data-parallel processes that ran it
    reproduce                       only for ``draftbench reproduce``: {table, table_path, table_sha256, part, target,
                                    target_loaded, rows: {label: row id}, model_dir} (harness.published.reproduce)

A missing manifest is not an error here (:func:`read_manifest` returns None); each caller says what it means:
``draftbench report`` and ``report --against`` go on without provenance, ``run --resume`` and ``compare`` /
``baseline save`` refuse the folder as not a run directory. An unreadable or invalid one is always an error naming
its path (:class:`ManifestError`).
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import math
import os
import socket
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from harness.schema import InputError

MANIFEST_FILE = "manifest.json"
RECORDS_FILE = "records.jsonl"
RECORDS_GLOB = "records*.jsonl"
LOAD_FILE = "load.jsonl"  # a run with load levels: one row per request (harness.run.load, harness.measure.load)
SUMMARY_MD = Path("tables", "summary.md")
LOCK_FILE = ".lock"


class ManifestError(ValueError):
    """A manifest that cannot be read or is not a JSON object; the message starts with the file's path."""


def records_file_name(rank: int | None = None) -> str:
    """The records file of one process: ``records.jsonl``, or ``records.rank<r>.jsonl`` in a data-parallel run."""
    return RECORDS_FILE if rank is None else f"records.rank{rank}.jsonl"


def dumps_json(obj: Any, indent: int | None = None, default: Callable[[Any], Any] | None = None) -> str:
    """Strict JSON text of ``obj``: NaN and infinities (which JSON has no literal for) become null. Arrays, sets and
    paths become lists and strings; any other type raises TypeError unless ``default`` converts it."""
    kw = dict(ensure_ascii=False, default=default or _jsonable, allow_nan=False, indent=indent)
    try:
        return json.dumps(obj, **kw)
    except ValueError:
        return json.dumps(_finite(obj), **kw)


def _finite(obj: Any) -> Any:
    """``obj`` with every non-finite float (at any depth) replaced by None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    if hasattr(obj, "tolist"):
        return _finite(obj.tolist())
    return obj


def _jsonable(obj: Any):
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"cannot serialise {type(obj).__name__}")


@contextlib.contextmanager
def atomic_file(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path`` (same folder, so the same file system; same suffix, so writers that infer the
    format from it - pandas, matplotlib - behave) that replaces ``path`` when the block ends (:func:`os.replace`). A
    reader sees the old file or the whole new one, never a part; on any failure (an exception, Ctrl-C) the temporary
    file is removed and ``path`` is left as it was. Example: ``with atomic_file(p) as tmp: df.to_csv(tmp)``."""
    path = Path(path)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=path.suffix)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` through :func:`atomic_file` (flushed to disk before it replaces ``path``)."""
    with atomic_file(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    return Path(path)


def write_manifest(run_dir: str | Path, manifest: Mapping[str, Any]) -> Path:
    """Write ``run_dir/manifest.json`` atomically (strict JSON, indent 1; unknown types as ``str``)."""
    return write_text_atomic(Path(run_dir) / MANIFEST_FILE, dumps_json(manifest, indent=1, default=str))


class RunInUseError(InputError):
    """Another live process holds the run directory's lock (:class:`RunLock`)."""


class RunLock:
    """The run directory's lock: one process at a time writes records into a run (two ``--resume`` of one run at
    once both redid every pending question). An advisory ``flock`` on ``run_dir/.lock``, which the kernel releases
    when the holder exits, however it exits (a kill -9 leaves no stale lock); the file names its holder. Example::

        lock = RunLock(run_dir).acquire()   # RunInUseError "... is in use by draftbench pid 4242 on host since ..."
        ...
        lock.release()
    """

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 512).decode("utf-8", "replace").strip() or "another process"
            os.close(fd)
            raise RunInUseError(f"{self.run_dir} is in use by {holder}; wait for it to end (or stop it), then resume "
                                "the run") from None
        since = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        os.ftruncate(fd, 0)
        os.write(fd, f"draftbench pid {os.getpid()} on {socket.gethostname()} since {since}\n".encode())
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None


def read_manifest(run_dir: str | Path) -> dict[str, Any] | None:
    """The run's manifest as a dict, or None when ``run_dir`` has no ``manifest.json`` (the caller decides what that
    means, see the module docstring). An unreadable file, invalid JSON or a value that is not a JSON object raises
    :class:`ManifestError` naming the path. Example: a file holding ``{truncated`` ->
    ``ManifestError("<run_dir>/manifest.json: corrupt manifest: Expecting property name ...")``."""
    path = Path(run_dir) / MANIFEST_FILE
    if not path.exists():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ManifestError(f"{path}: corrupt manifest: {e}") from None
    if not isinstance(manifest, dict):
        raise ManifestError(f"{path}: corrupt manifest: expected a JSON object, got {type(manifest).__name__}")
    return manifest
