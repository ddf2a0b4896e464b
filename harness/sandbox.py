"""Run model-written Python (HumanEval completions) in a separate, fenced-in process.

:func:`run_untrusted` starts ``python -I -B harness/sandbox.py <config>``; that child (the *bootstrap*, the code
under ``__main__`` below, standard library only) fences itself in and then ``exec``s the program. Layers, from
strongest to weakest:

Kernel-enforced (cannot be undone from Python once in place):
    * a separate process in its own session/process group, with stdin closed, a minimal environment
      (no proxies, ``HOME`` and ``TMPDIR`` = the working directory) and a fresh temporary working directory that
      is deleted afterwards;
    * a wall-clock timeout after which the whole process group is SIGKILLed (and it is SIGKILLed at the end in
      any case, so nothing outlives the call unless it left the group, which the seccomp filter prevents);
    * rlimits: RLIMIT_AS (memory), RLIMIT_CPU, RLIMIT_FSIZE (also caps captured stdout/stderr, which are files),
      RLIMIT_NOFILE, RLIMIT_CORE=0, and RLIMIT_NPROC for non-root users (the kernel ignores it for uid 0);
    * a new network namespace (``unshare(CLONE_NEWUSER|CLONE_NEWNET)``, or ``CLONE_NEWNET`` alone as root where
      user namespaces are disabled): no interface but a down loopback, so every connection fails. The user
      namespace also drops the host capabilities;
    * on Linux x86_64/aarch64 a seccomp filter that refuses (EPERM) new processes (fork, vfork, clone without
      CLONE_THREAD, execve), sockets, ptrace, process_vm_* and signals to any other process.

Best effort (Python level; native code or a determined attacker can get around them):
    * an audit hook (:func:`sys.addaudithook`) that refuses opening files for writing, and deleting, renaming,
      chmod-ing etc., anywhere outside the working directory (paths resolved with ``realpath``; operations via a
      ``dir_fd`` or on a file descriptor are refused outright), and refuses sockets, subprocesses, ``ctypes`` and
      signals to other processes. A C extension that is already installed can call libc directly past it;
    * where no network namespace could be made, ``socket.socket``, ``socket.create_connection`` and
      ``socket.getaddrinfo`` are replaced by functions that raise PermissionError.

Not provided: read isolation (the program can read any file the calling user can), a PID or mount namespace,
cgroup limits, or a uid change. As root inside a user namespace the process keeps owner rights on root-owned
files, so only the audit hook stops writes there. This is enough for benchmark completions from ordinary models;
for code you have reason to distrust, run the whole harness in a container or VM.

:attr:`SandboxResult.protections` records which layers were actually in place for each run.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

OUTPUT_CAP_BYTES = 1 << 20  # at most this much of stdout and of stderr is returned
PROGRAM_NAME = "main.py"


class SandboxError(RuntimeError):
    """The sandbox itself failed to start (not the program inside it); the message includes the bootstrap's stderr."""


@dataclass
class SandboxResult:
    """What the untrusted program did.

    returncode: the exit status (negative: killed by that signal). timed_out: the wall-clock limit was hit and the
    process group was killed. killed_reason: "timeout", "cpu_limit", "memory_limit", "file_size_limit",
    "signal SIGxxx" or None for an ordinary exit. protections: the layers that were in place (see the module
    docstring), e.g. ("rlimits", "netns", "seccomp", "audit_hook").
    """

    returncode: int
    stdout: str
    stderr: str
    timed_out: bool
    killed_reason: str | None
    protections: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


def run_untrusted(code: str, timeout_s: float = 10, memory_mb: int = 1024, max_processes: int = 64,
                  max_file_mb: int = 16) -> SandboxResult:
    """Run ``code`` as ``__main__`` in a sandboxed ``python -I`` child and return its exit status and output.

    timeout_s: wall-clock limit (the CPU limit is this rounded up, plus one second). memory_mb: address-space limit.
    max_processes: RLIMIT_NPROC headroom for non-root users, used only where the seccomp filter is unavailable.
    max_file_mb: the largest file (including captured stdout/stderr) the program may write.
    Raises :class:`SandboxError` if the bootstrap could not start; the program's own failures are in the result.
    """
    _check_positive(timeout_s=timeout_s, memory_mb=memory_mb, max_processes=max_processes, max_file_mb=max_file_mb)
    outer = tempfile.mkdtemp(prefix="draftbench-sandbox-")
    try:
        work = os.path.join(outer, "work")
        os.mkdir(work, 0o700)
        with open(os.path.join(work, PROGRAM_NAME), "w", encoding="utf-8") as f:
            f.write(code)
        config = {"workdir": work, "program": PROGRAM_NAME, "memory_mb": memory_mb,
                  "cpu_s": math.ceil(timeout_s) + 1, "max_file_mb": max_file_mb, "max_processes": max_processes}
        return _spawn(config, outer, timeout_s)
    finally:
        _remove_tree(outer)


def _check_positive(**values: float) -> None:
    for name, value in values.items():
        if not value > 0:
            raise ValueError(f"run_untrusted: {name} must be > 0, got {value!r}")


def _spawn(config: dict, outer: str, timeout_s: float) -> SandboxResult:
    """Start the bootstrap, wait up to ``timeout_s``, kill its process group, and collect the result."""
    status_r, status_w = os.pipe()
    config["status_fd"] = status_w
    out_path, err_path = os.path.join(outer, "stdout"), os.path.join(outer, "stderr")
    env = {"PATH": os.defpath, "HOME": config["workdir"], "TMPDIR": config["workdir"], "LANG": "C.UTF-8",
           "LC_ALL": "C.UTF-8"}
    cmd = [sys.executable, "-I", "-B", os.path.abspath(__file__), json.dumps(config)]
    try:
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env,
                                    cwd=config["workdir"], start_new_session=True, pass_fds=(status_w,))
        os.close(status_w)
        status_w = -1
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        _kill_group(proc.pid)
        proc.wait()
        status = _read_status(status_r)
    finally:
        os.close(status_r)
        if status_w >= 0:
            os.close(status_w)
    stdout, stderr = _read_capped(out_path), _read_capped(err_path)
    if status is None and not timed_out:
        raise SandboxError(f"sandbox bootstrap failed before running the program (exit {proc.returncode}): "
                           f"{stderr[-2000:]}")
    return SandboxResult(returncode=proc.returncode, stdout=stdout, stderr=stderr, timed_out=timed_out,
                         killed_reason=killed_reason(proc.returncode, timed_out, stderr),
                         protections=tuple((status or {}).get("protections", ())))


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _read_status(fd: int) -> dict | None:
    """The bootstrap's one JSON line (written just before the program starts); None if it never got that far."""
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
    raw = b"".join(chunks).strip()
    return json.loads(raw) if raw else None


def _read_capped(path: str) -> str:
    with open(path, "rb") as f:
        data = f.read(OUTPUT_CAP_BYTES + 1)
    text = data[:OUTPUT_CAP_BYTES].decode("utf-8", errors="replace")
    if len(data) > OUTPUT_CAP_BYTES:
        text += f"\n[draftbench sandbox: output truncated at {OUTPUT_CAP_BYTES} bytes]"
    return text


def _remove_tree(path: str) -> None:
    """Delete ``path`` even if the program made parts of it read-only."""

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
# The bootstrap: everything below runs in the child, before and around the untrusted program.

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
CLONE_THREAD = 0x00010000

# seccomp: architecture id and the syscall numbers the filter refuses (None: the syscall does not exist there)
_SECCOMP_ARCH = {
    "x86_64": {"audit_arch": 0xC000003E, "x32_bit": 0x40000000, "clone": 56, "clone3": 435,
               "deny": {"fork": 57, "vfork": 58, "execve": 59, "execveat": 322, "socket": 41, "ptrace": 101,
                        "tkill": 200, "rt_sigqueueinfo": 129, "rt_tgsigqueueinfo": 297,
                        "pidfd_send_signal": 424, "pidfd_open": 434, "process_vm_readv": 310,
                        "process_vm_writev": 311},
               "own_pid_only": {"kill": 62, "tgkill": 234}},
    "aarch64": {"audit_arch": 0xC00000B7, "x32_bit": None, "clone": 220, "clone3": 435,
                "deny": {"execve": 221, "execveat": 281, "socket": 198, "ptrace": 117, "tkill": 130,
                         "rt_sigqueueinfo": 138, "rt_tgsigqueueinfo": 240, "pidfd_send_signal": 424,
                         "pidfd_open": 434, "process_vm_readv": 270, "process_vm_writev": 271},
                "own_pid_only": {"kill": 129, "tgkill": 131}},
}

_BPF_LD_W_ABS, _BPF_JEQ_K, _BPF_JGE_K, _BPF_JSET_K, _BPF_RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_EPERM, _ENOSYS = 1, 38
_OFF_NR, _OFF_ARCH, _OFF_ARG0 = 0, 4, 16  # offsets in struct seccomp_data (arg0's low 32 bits, little endian)


def seccomp_program(machine: str, own_pid: int) -> list[tuple[int, int, int, int]]:
    """The seccomp BPF filter as (code, jt, jf, k) instructions, or [] for an architecture it does not know.

    Every rule block starts with the syscall number in the accumulator and either returns or jumps past itself:
    wrong architecture -> EPERM; denied syscalls -> EPERM; clone3 -> ENOSYS (glibc then falls back to clone, whose
    flags BPF can read); clone -> allowed only with CLONE_THREAD (threads yes, processes no); kill/tgkill ->
    allowed only for ``own_pid`` or 0 (own process group); anything else -> allowed.
    """
    arch = _SECCOMP_ARCH.get(machine)
    if arch is None:
        return []
    deny = _RET_ERRNO | _EPERM
    prog = [(_BPF_LD_W_ABS, 0, 0, _OFF_ARCH), (_BPF_JEQ_K, 1, 0, arch["audit_arch"]), (_BPF_RET_K, 0, 0, deny),
            (_BPF_LD_W_ABS, 0, 0, _OFF_NR)]
    if arch["x32_bit"] is not None:
        prog += [(_BPF_JGE_K, 0, 1, arch["x32_bit"]), (_BPF_RET_K, 0, 0, deny)]
    for nr in arch["deny"].values():
        prog += [(_BPF_JEQ_K, 0, 1, nr), (_BPF_RET_K, 0, 0, deny)]
    prog += [(_BPF_JEQ_K, 0, 1, arch["clone3"]), (_BPF_RET_K, 0, 0, _RET_ERRNO | _ENOSYS)]
    prog += [(_BPF_JEQ_K, 0, 4, arch["clone"]), (_BPF_LD_W_ABS, 0, 0, _OFF_ARG0),
             (_BPF_JSET_K, 0, 1, CLONE_THREAD), (_BPF_RET_K, 0, 0, _RET_ALLOW), (_BPF_RET_K, 0, 0, deny)]
    for nr in arch["own_pid_only"].values():
        prog += [(_BPF_JEQ_K, 0, 5, nr), (_BPF_LD_W_ABS, 0, 0, _OFF_ARG0), (_BPF_JEQ_K, 2, 0, own_pid),
                 (_BPF_JEQ_K, 1, 0, 0), (_BPF_RET_K, 0, 0, deny), (_BPF_RET_K, 0, 0, _RET_ALLOW)]
    prog.append((_BPF_RET_K, 0, 0, _RET_ALLOW))
    return prog


def install_seccomp_filter() -> bool:
    """Install :func:`seccomp_program` on the calling process (irrevocably, inherited by threads); False if impossible."""
    import ctypes
    import platform

    prog = seccomp_program(platform.machine(), os.getpid())
    if not prog or not sys.platform.startswith("linux"):
        return False

    class SockFilter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]

    filters = (SockFilter * len(prog))(*[SockFilter(*ins) for ins in prog])
    fprog = SockFprog(len(prog), filters)
    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_no_new_privs, pr_set_seccomp, seccomp_mode_filter = 38, 22, 2
    if libc.prctl(pr_set_no_new_privs, ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)):
        return False
    return libc.prctl(pr_set_seccomp, ctypes.c_ulong(seccomp_mode_filter), ctypes.byref(fprog),
                      ctypes.c_ulong(0), ctypes.c_ulong(0)) == 0


def _enter_network_namespace() -> str | None:
    """Unshare into a new network namespace; return how ("netns" / "netns_root") or None if not permitted."""
    import ctypes

    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0:
        return "netns"
    if libc.unshare(CLONE_NEWNET) == 0:
        return "netns_root"
    return None


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


def _block_sockets() -> None:
    import socket

    def refuse(*_args, **_kwargs):
        raise PermissionError("draftbench sandbox: network access is not allowed")

    socket.socket = refuse  # type: ignore[assignment, misc]
    socket.create_connection = refuse  # type: ignore[assignment]
    socket.getaddrinfo = refuse  # type: ignore[assignment]


_REFUSED_EVENTS = frozenset({
    "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system", "subprocess.Popen", "pty.spawn",
    "socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo", "socket.gethostbyname",
    "socket.gethostbyname_ex", "socket.gethostbyaddr", "socket.sendto", "socket.sendmsg",
    "ctypes.dlopen", "ctypes.dlsym", "ctypes.dlsym/handle", "ctypes.cdata", "ctypes.cdata/buffer",
    "ctypes.addressof", "ctypes.call_function", "resource.setrlimit", "resource.prlimit",
})
# event -> indices of the path arguments that must lie inside the working directory
_PATH_EVENTS = {"os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.chmod": (0,), "os.chown": (0,),
                "os.truncate": (0,), "os.utime": (0,), "os.rename": (0, 1), "os.link": (0, 1), "os.symlink": (1,),
                "shutil.rmtree": (0,), "os.chflags": (0,), "os.lchflags": (0,), "os.mkfifo": (0,), "os.mknod": (0,)}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


def make_audit_hook(workdir: str):
    """An audit hook refusing writes outside ``workdir`` and the events in ``_REFUSED_EVENTS`` (see module docstring)."""
    root = os.path.realpath(workdir)
    own_pid = os.getpid()

    def inside(path) -> bool:
        if isinstance(path, int) or path is None:
            return False
        real = os.path.realpath(os.fsdecode(path))
        return real == root or real.startswith(root + os.sep) or real == os.devnull

    def hook(event: str, args: tuple) -> None:
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None))[:3]
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or \
                      (isinstance(flags, int) and flags & _WRITE_FLAGS)
            if writing and not isinstance(path, int) and not inside(path):
                raise PermissionError(f"draftbench sandbox: writing {path!r} outside the working directory")
        elif event in _REFUSED_EVENTS:
            raise PermissionError(f"draftbench sandbox: {event} is not allowed")
        elif event in _PATH_EVENTS:
            dir_fds = [a for a in args[2:] if isinstance(a, int) and a != -100]  # -100 = AT_FDCWD
            if dir_fds or not all(inside(args[i]) for i in _PATH_EVENTS[event]):
                raise PermissionError(f"draftbench sandbox: {event} outside the working directory")
        elif event in ("os.kill", "os.killpg") and args[0] not in (own_pid, 0):
            raise PermissionError(f"draftbench sandbox: {event} of another process")

    return hook


def _bootstrap(config: dict) -> None:
    """Fence this process in (see the module docstring), report the layers on the status pipe, run the program."""
    protections = ["rlimits"]
    network = _enter_network_namespace()
    if network:
        protections.append(network)
    if install_seccomp_filter():
        protections.append("seccomp")
    _set_limits(config)
    if not network:
        _block_sockets()
        protections.append("socket_patch")
    os.chdir(config["workdir"])
    with open(config["program"], encoding="utf-8") as f:
        source = f.read()
    for name in [m for m in sys.modules if m == "ctypes" or m.startswith("ctypes.")]:
        del sys.modules[name]  # a fresh ``import ctypes`` must go through the audit hook's ctypes.dlopen check
    protections.append("audit_hook")
    with os.fdopen(config["status_fd"], "w") as status:
        status.write(json.dumps({"protections": protections}) + "\n")
    sys.argv = [config["program"]]
    sys.path.insert(0, config["workdir"])
    sys.addaudithook(make_audit_hook(config["workdir"]))
    exec(compile(source, config["program"], "exec"),
         {"__name__": "__main__", "__file__": config["program"], "__builtins__": __builtins__})


if __name__ == "__main__":
    _bootstrap(json.loads(sys.argv[1]))
