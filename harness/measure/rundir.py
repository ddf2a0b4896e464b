"""A run directory (``<output_dir>/<run_id>/``): the names of its files, strict JSON text, atomic writes, and the
manifest (its one reader, its one writer and its schema).

The files of a run directory::

    manifest.json               what was run, on what, by whom (MANIFEST_FILE; schema below), written once by the
                                runner before the first question
    records.jsonl               one measured turn per line (RECORDS_FILE; harness.measure.records); a data-parallel
                                run's process r writes records.rank<r>.jsonl (records_file_name); readers take every
                                records*.jsonl (RECORDS_GLOB)
    load.jsonl                  a run with load levels (config ``load``) has these instead: one row per request
                                (LOAD_FILE; harness.run.load writes a level's rows together, harness.report.load)
    tables/, plots/             what ``draftbench report`` rebuilds from the records (harness.report.report);
                                tables/summary.md (SUMMARY_MD) is also copied by ``draftbench baseline save``
    .lock                       held (flock) by the one process that writes records into the run (LOCK_FILE,
                                :class:`RunLock`); it says who holds it

The manifest, a JSON object (``harness.run.manifest.build_manifest`` writes it; readers never require a key but
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

Every file of a run that draftbench writes, appends to or reads is opened by :func:`open_run_file`, which never
follows a symbolic link out of the run folder and takes regular files only: runs are shared (CI artefacts), and a
``records.jsonl`` or ``.lock`` that links to another file must not make ``--resume`` truncate or append to that file,
nor a FIFO or device in its place make ``report`` block or read without end. Such a file is a :class:`RunFileError`,
one line naming it and what it is.

A missing manifest is not an error here (:func:`read_manifest` returns None); each caller says what it means:
``draftbench report`` and ``report --against`` go on without provenance, ``run --resume`` and ``compare`` /
``baseline save`` refuse the folder as not a run directory. An unreadable or invalid one is always an error naming
its path (:class:`ManifestError`).
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import math
import os
import re
import socket
import stat
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from harness.schema import InputError

MANIFEST_FILE = "manifest.json"
RECORDS_FILE = "records.jsonl"
RECORDS_GLOB = "records*.jsonl"
LOAD_FILE = "load.jsonl"  # a run with load levels: one row per request (harness.run.load, harness.report.load)
SUMMARY_MD = Path("tables", "summary.md")
LOCK_FILE = ".lock"


class ManifestError(ValueError):
    """A manifest that cannot be read or is not a JSON object; the message starts with the file's path."""


class RunFileError(InputError):
    """A file of a run directory that draftbench will not open: a symbolic link (for writing; for reading, one that
    leads out of the run folder), a FIFO, device, socket or directory, or (for writing) a file with other hard links;
    the message starts with the file's path."""


_KINDS = {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFCHR: "a character device",
          stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket", stat.S_IFLNK: "a symbolic link"}
_OPEN_FLAGS = {"rb": os.O_RDONLY, "ab": os.O_WRONLY | os.O_APPEND | os.O_CREAT, "r+b": os.O_RDWR | os.O_CREAT}


def file_kind(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` is, in words: "a regular file", "a FIFO (named pipe)", "a directory", ..."""
    return _KINDS.get(stat.S_IFMT(mode), "a regular file" if stat.S_ISREG(mode) else "not a regular file")


def open_run_file(path: str | Path, mode: str = "rb") -> Any:
    """``path``, a file of a run directory, opened in binary ``mode`` ("rb"; "ab" appends and "r+b" reads and writes,
    both creating a missing file 0666 less the umask, as ``open`` does) without following a symbolic link and
    without blocking.

    Written files must be regular files with one name: a symbolic link (wherever it points), a hard link (the data
    has another name elsewhere) or anything but a regular file is refused, so writing a run never changes a file
    outside it. Read files must be regular files; a symbolic link is followed only to a regular file in the same
    folder. A refusal is a :class:`RunFileError` naming the path and what it is, e.g. ``RUN/records.jsonl: a
    symbolic link to /home/me/.bashrc; draftbench writes only regular files of the run folder (remove the link)``;
    a missing file read is FileNotFoundError."""
    return os.fdopen(open_run_fd(path, mode), mode)


def open_run_fd(path: str | Path, mode: str = "rb") -> int:
    """:func:`open_run_file`'s file descriptor (the caller closes it)."""
    path = Path(path)
    writing = mode != "rb"
    flags = _OPEN_FLAGS[mode] | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o666)
    except IsADirectoryError:
        raise RunFileError(f"{path}: a directory, not a regular file") from None
    except OSError as e:
        if e.errno not in (errno.ELOOP, errno.EMLINK) or not path.is_symlink():
            raise
        target = Path(os.path.realpath(path))
        if writing:
            raise RunFileError(f"{path}: a symbolic link to {target}; draftbench writes only regular files of the run "
                               "folder (remove the link)") from None
        if target.parent != Path(os.path.realpath(path.parent)) or target.is_symlink() or not target.exists():
            raise RunFileError(f"{path}: a symbolic link to {target}, not a file of the run folder; draftbench reads "
                               "only the run folder's own files (copy the file in instead)") from None
        return open_run_fd(target, mode)
    info = os.fstat(fd)
    problem = None
    if not stat.S_ISREG(info.st_mode):
        problem = f"{file_kind(info.st_mode)}, not a regular file"
    elif writing and info.st_nlink > 1:
        problem = (f"a regular file with {info.st_nlink} hard links (its data has another name elsewhere); "
                   "draftbench writes only files of the run's own")
    if problem:
        os.close(fd)
        raise RunFileError(f"{path}: {problem}")
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    return fd


def run_subdir(run_dir: str | Path, name: str) -> Path:
    """``run_dir/name`` (``tables``, ``plots``), created if missing: a folder of the run's own, never a symbolic link
    (report files written through it would land wherever it points) nor a file (:class:`RunFileError`)."""
    path = Path(run_dir) / name
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        what = f"a symbolic link to {os.path.realpath(path)}" if path.is_symlink() else file_kind(path.stat().st_mode)
        raise RunFileError(f"{path}: {what}, not a folder of the run; draftbench writes only into the run "
                           "folder's own folders (remove it)")
    path.mkdir(exist_ok=True)
    return path


def file_stem(text: str, limit: int = 120) -> str:
    """``text`` (a method name, an option, a table id: read from records or a user's file) as a file name stem that
    stays in its folder: every run of characters other than letters, digits, ``.``, ``_``, ``=``, ``-`` becomes
    ``_``, no leading dot, at most ``limit`` characters. Example: "../../x/evil" -> "_.._x_evil" (one name, no
    folder); "eagle2" -> "eagle2"."""
    stem = re.sub(r"[^A-Za-z0-9._=-]+", "_", str(text)).lstrip(".")[:limit]
    return stem or "_"


def read_run_file(path: str | Path) -> bytes | None:
    """The bytes of a run directory's file (:func:`open_run_file`'s checks), or None when there is no such file."""
    if not os.path.lexists(path):
        return None
    with open_run_file(path) as f:
        return f.read()


def records_file_name(rank: int | None = None) -> str:
    """The records file of one process: ``records.jsonl``, or ``records.rank<r>.jsonl`` in a data-parallel run."""
    return RECORDS_FILE if rank is None else f"records.rank{rank}.jsonl"


def dumps_json(obj: Any, indent: int | None = None, default: Callable[[Any], Any] | None = None) -> str:
    """Strict JSON text of ``obj``: NaN and infinities (which JSON has no literal for) become null. Arrays, sets and
    paths become lists and strings; any other type raises TypeError unless ``default`` converts it. The text is
    always valid UTF-8: a lone surrogate in a string (which UTF-8 cannot encode; a tokenizer or a server can emit
    one) is written as its JSON escape (``"\\ud800"``), which :func:`json.loads` reads back as the same string. NUL
    and the other control characters are escaped by JSON itself."""
    kw = dict(ensure_ascii=False, default=default or _jsonable, allow_nan=False, indent=indent)
    try:
        text = json.dumps(obj, **kw)
    except ValueError:
        text = json.dumps(_finite(obj), **kw)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # only lone surrogates, and only inside JSON strings, where \uXXXX is their escape
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


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
    format from it - pandas, matplotlib - behave; mode 0666 less the umask, as ``open`` would give) that replaces
    ``path`` when the block ends (:func:`os.replace`, which replaces a symbolic link, never the file it points to). A
    reader sees the old file or the whole new one, never a part; on any failure (an exception, Ctrl-C) the temporary
    file is removed and ``path`` is left as it was (an OSError, such as a full disk, is raised again naming ``path``,
    not the temporary file). Example: ``with atomic_file(p) as tmp: df.to_csv(tmp)``."""
    path = Path(path)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=path.suffix)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp's 0600 would keep the report from everyone the umask lets read
    finally:
        os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(e, OSError):  # not "[Errno 28] No space left on device: '.summary.1a2b.parquet'"
            raise OSError(f"{path}: cannot write it: {e.strerror or e}") from None
        raise


def _umask() -> int:
    """The process's umask: Linux shows it in /proc/self/status; elsewhere reading it means setting it (and setting
    it back at once)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


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
        fd = open_run_fd(self.path, "r+b")
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
    try:
        data = read_run_file(path)
        if data is None:
            return None
        manifest = json.loads(data.decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ManifestError(f"{path}: corrupt manifest: {e}") from None
    if not isinstance(manifest, dict):
        raise ManifestError(f"{path}: corrupt manifest: expected a JSON object, got {type(manifest).__name__}")
    return manifest
