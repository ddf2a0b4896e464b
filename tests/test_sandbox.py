"""harness.sandbox: untrusted code is stopped, fenced in and cannot reach the network or the rest of the disk."""

import os
import platform
import socket
import sys
import threading
import uuid

import pytest

from harness.sandbox import (
    SandboxError,
    install_seccomp_filter,
    killed_reason,
    run_untrusted,
    seccomp_program,
)

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sandbox layers are Linux-specific")


def test_correct_code_passes_and_output_is_captured():
    """A harmless program must run normally, or every HumanEval completion would score 0."""
    r = run_untrusted("import math\nprint(math.factorial(5))\nimport sys\nprint('err', file=sys.stderr)")
    assert (r.returncode, r.stdout, r.stderr, r.timed_out, r.killed_reason) == (0, "120\n", "err\n", False, None)
    assert r.ok


def test_failing_code_reports_its_exit_status():
    """A failing assertion (a wrong completion) must come back as a non-zero exit, not as a sandbox error."""
    r = run_untrusted("assert 1 + 1 == 3")
    assert r.returncode == 1 and "AssertionError" in r.stderr and not r.ok


def test_syntax_error_is_the_programs_failure_not_the_sandboxes():
    """Broken model code is an ordinary failure (exit 1), not a SandboxError that would abort a whole run."""
    r = run_untrusted("def f(:\n")
    assert r.returncode == 1 and "SyntaxError" in r.stderr


def test_infinite_loop_is_stopped_by_the_timeout():
    """Without the wall-clock kill a `while True` completion would hang the benchmark forever."""
    r = run_untrusted("while True:\n    pass\n", timeout_s=1)
    assert r.timed_out and r.killed_reason == "timeout" and r.returncode < 0


def test_sleeping_program_is_stopped_by_the_timeout():
    """CPU limits alone do not stop a sleeping process; the wall-clock kill must."""
    r = run_untrusted("import time\ntime.sleep(60)\n", timeout_s=1)
    assert r.timed_out and r.killed_reason == "timeout"


def test_write_outside_the_working_directory_fails():
    """If this file appeared, model code could overwrite anything the benchmark user can write."""
    target = f"/tmp/draftbench-escape-{uuid.uuid4().hex}.txt"
    try:
        r = run_untrusted(f"open({target!r}, 'w').write('escaped')\n")
        assert r.returncode != 0 and "PermissionError" in r.stderr
        r = run_untrusted(f"import os\nos.open({target!r}, os.O_WRONLY | os.O_CREAT)\n")
        assert r.returncode != 0 and "PermissionError" in r.stderr
        assert not os.path.exists(target)
    finally:
        if os.path.exists(target):
            os.remove(target)


def test_writes_inside_the_working_directory_work_and_are_cleaned_up():
    """Programs may use scratch files in their own directory, which must not outlive the run."""
    r = run_untrusted("import os\nopen('scratch.txt', 'w').write('hi')\nprint(os.getcwd())\n"
                      "print(open('scratch.txt').read())\n")
    assert r.returncode == 0, r.stderr
    workdir, content = r.stdout.split()
    assert content == "hi"
    assert not os.path.exists(workdir)


def test_connecting_to_localhost_fails():
    """A server on the benchmark machine (127.0.0.1) must be unreachable from model code."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    try:
        r = run_untrusted(f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
                          "print('connected')\n", timeout_s=5)
    finally:
        server.close()
    assert r.returncode != 0 and "connected" not in r.stdout
    assert "PermissionError" in r.stderr or "OSError" in r.stderr


def test_memory_bomb_is_stopped():
    """An allocation loop must hit RLIMIT_AS (MemoryError) instead of exhausting the machine's memory."""
    r = run_untrusted("chunks = []\nwhile True:\n    chunks.append(bytearray(50 * 1024 * 1024))\n",
                      memory_mb=256, timeout_s=20)
    assert r.returncode != 0 and not r.timed_out
    assert r.killed_reason == "memory_limit"


def test_fork_bomb_is_contained():
    """os.fork and subprocess must be refused, so a fork bomb cannot fill the process table."""
    r = run_untrusted("import os\nwhile True:\n    os.fork()\n", timeout_s=5)
    assert r.returncode == 1 and not r.timed_out and "PermissionError" in r.stderr
    r = run_untrusted("import subprocess\nsubprocess.run(['true'])\n", timeout_s=5)
    assert r.returncode == 1 and "PermissionError" in r.stderr


def test_huge_output_is_capped_by_the_file_size_limit():
    """A print loop must stop at RLIMIT_FSIZE rather than filling the disk with captured stdout."""
    r = run_untrusted("while True:\n    print('x' * 10000)\n", max_file_mb=1, timeout_s=10)
    assert r.killed_reason == "file_size_limit" and not r.timed_out
    assert len(r.stdout) <= 1024 * 1024 + 100


def test_ctypes_is_refused():
    """ctypes would let code call libc directly, around every Python-level guard."""
    r = run_untrusted("import ctypes\nctypes.CDLL(None)\n")
    assert r.returncode == 1 and "PermissionError" in r.stderr


@linux_only
def test_protections_are_recorded():
    """Each result must say which layers were active, so a run on a weaker machine is visible in the records."""
    r = run_untrusted("pass")
    assert "rlimits" in r.protections and "audit_hook" in r.protections
    assert any(p in r.protections for p in ("netns", "netns_root", "socket_patch"))


def test_bad_arguments_name_the_parameter():
    """A zero timeout would kill every program at once; the error must say which argument is wrong."""
    with pytest.raises(ValueError, match="timeout_s"):
        run_untrusted("pass", timeout_s=0)
    assert issubclass(SandboxError, RuntimeError)


@pytest.mark.parametrize("returncode, timed_out, stderr, expected", [
    (-9, True, "", "timeout"),                                       # our wall-clock kill
    (-24, False, "", "cpu_limit"),                                   # SIGXCPU from RLIMIT_CPU
    (1, False, "Traceback ...\nMemoryError\n", "memory_limit"),      # RLIMIT_AS surfaces as MemoryError
    (1, False, "OSError: [Errno 27] File too large", "file_size_limit"),
    (-11, False, "", "signal SIGSEGV"),
    (1, False, "AssertionError", None),                              # an ordinary failing test
    (0, False, "", None),
])
def test_killed_reason(returncode, timed_out, stderr, expected):
    """The reason column must separate limit hits from ordinary failures."""
    assert killed_reason(returncode, timed_out, stderr) == expected


def test_seccomp_program_shape():
    """The filter must end in ALLOW (or every syscall fails) and start by checking the architecture."""
    prog = seccomp_program("x86_64", own_pid=1234)
    assert prog[0] == (0x20, 0, 0, 4) and prog[1] == (0x15, 1, 0, 0xC000003E)
    assert prog[-1] == (0x06, 0, 0, 0x7FFF0000)
    assert all(0 <= jt < 256 and 0 <= jf < 256 and jt + i < len(prog) and jf + i < len(prog)
               for i, (_, jt, jf, _) in enumerate(prog))
    assert seccomp_program("sparc", own_pid=1) == []


@pytest.mark.skipif(platform.machine() not in ("x86_64", "aarch64") or not sys.platform.startswith("linux"),
                    reason="seccomp filter is defined for Linux x86_64/aarch64 only")
def test_seccomp_filter_alone_blocks_fork_socket_exec_and_foreign_signals():
    """The kernel layer must hold even without the audit hook: in a forked child with only the filter installed,
    fork, socket, exec and signalling the parent fail with EPERM while threads and signalling itself work."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        outcome = []
        try:
            outcome.append(install_seccomp_filter())
            for attempt in (os.fork, socket.socket, lambda: os.kill(os.getppid(), 0),
                            lambda: os.execv("/bin/true", ["true"])):
                try:
                    attempt()
                    outcome.append("allowed")
                except PermissionError:
                    outcome.append("EPERM")
            os.kill(os.getpid(), 0)
            ran = []
            t = threading.Thread(target=lambda: ran.append(True))
            t.start()
            t.join()
            outcome.append(ran == [True])
        finally:
            os.write(write_fd, repr(outcome).encode())
            os._exit(0)
    os.close(write_fd)
    os.waitpid(pid, 0)
    outcome = os.read(read_fd, 1000).decode()
    os.close(read_fd)
    assert outcome == repr([True, "EPERM", "EPERM", "EPERM", "EPERM", True])


def test_socket_patch_fallback_refuses_connections():
    """Where no network namespace can be made the bootstrap patches socket; the patched calls must raise
    PermissionError (checked in a forked child so pytest's own socket module stays intact)."""
    from harness.sandbox import _block_sockets

    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        outcome = []
        try:
            _block_sockets()
            for attempt in (socket.socket, lambda: socket.create_connection(("127.0.0.1", 1)),
                            lambda: socket.getaddrinfo("localhost", 80)):
                try:
                    attempt()
                    outcome.append("allowed")
                except PermissionError:
                    outcome.append("refused")
        finally:
            os.write(write_fd, repr(outcome).encode())
            os._exit(0)
    os.close(write_fd)
    os.waitpid(pid, 0)
    outcome = os.read(read_fd, 1000).decode()
    os.close(read_fd)
    assert outcome == repr(["refused", "refused", "refused"])
