"""The attack suite: hostile verifier code, each case contained with the stated outcome.

Every case checks that the error is reported for the item, that the next batch still scores
(the worker keeps serving), and, through the `guard` fixture, that no sandbox process
survives the verifier and that no planted secret shows up in any score or error.
"""

import os
import textwrap
import time
from pathlib import Path

import pytest

from workers.verifiers import VerifierBudgetExceeded, open_verifier
from workers.verifiers.python_kind import PythonVerifier

SECRET = "s3cr3t-planted-by-the-attack-suite"


def s(completion: str, **fields):
    return {"prompt": "p", "completion": completion, **fields}


def _descendants(pid: int) -> set[int]:
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids = (task / "children").read_text().split()
            except OSError:
                continue
            for k in map(int, kids):
                if k not in out:
                    out.add(k)
                    todo.append(k)
    return out


class Guard:
    """Opens verifiers, remembers every sandbox process they started, checks the outcome."""

    def __init__(self, tmp_path: Path):
        self.verifiers: list[PythonVerifier] = []
        self.pids: set[int] = set()
        self.data_dir = tmp_path / "data" / "tenants" / "other"
        self.data_dir.mkdir(parents=True)
        self.dataset = self.data_dir / "dataset.jsonl"
        self.dataset.write_text(f'{{"prompt": "{SECRET}"}}\n')

    def open(self, source: str, **config) -> PythonVerifier:
        cfg = {"source": textwrap.dedent(source), "timeout_s": 1.0, **config}
        v = open_verifier("python", cfg, name="attack")
        assert isinstance(v, PythonVerifier)
        self.verifiers.append(v)
        return v

    def score(self, v: PythonVerifier, samples: list[dict]) -> tuple[list, list]:
        scores, errors = v.score(samples)
        if v._child is not None:
            self.pids |= {v._child.proc.pid, *_descendants(v._child.proc.pid)}
        assert not any(SECRET in (e or "") for e in errors), errors
        return scores, errors

    def finish(self) -> None:
        for v in self.verifiers:
            v.close()
        alive = [p for p in self.pids if Path(f"/proc/{p}").exists()]
        assert not alive, f"sandbox processes survived: {alive}"


@pytest.fixture
def guard(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_ATTACK_SECRET", SECRET)
    g = Guard(tmp_path)
    yield g
    g.finish()


def when_x(statement: str) -> str:
    """A verifier that runs `statement` for the completion 'x' and scores 1.0 otherwise."""
    return (
        "import ctypes, os, subprocess, sys, threading, time\n"
        "def verify(prompt, completion):\n"
        f"    if completion == 'x':\n        {statement}\n"
        "    return 1.0\n"
    )


def recovers(guard: Guard, v: PythonVerifier) -> None:
    assert guard.score(v, [s("ok")]) == ([1.0], [None])


# ----------------------------------------------------------------------------- time


@pytest.mark.parametrize("body", ["while True: pass", "time.sleep(30)"])
def test_loop_or_sleep_past_the_deadline_is_killed(guard, body):
    v = guard.open(when_x(body), timeout_s=0.5)
    start = time.monotonic()
    scores, errors = guard.score(v, [s("ok"), s("x")])
    assert time.monotonic() - start < 1.5
    assert scores == [1.0, None] and errors[1] == "timeout after 0.5s"
    recovers(guard, v)


def test_sleeping_just_under_the_deadline_spends_the_budget(guard):
    # Two 2 s calls fit the 5.5 s budget and the third spends it, whatever a loaded machine
    # adds to each call up to 0.75 s (a 0.35 s sleep under a 0.5 s deadline was cut off there).
    src = "import time\ndef verify(prompt, completion):\n    time.sleep(2.0)\n    return 1.0\n"
    v = guard.open(src, timeout_s=4.0, budget_s=5.5)
    assert guard.score(v, [s("a")]) == ([1.0], [None])
    assert guard.score(v, [s("a")]) == ([1.0], [None])
    with pytest.raises(VerifierBudgetExceeded, match="'attack'.*budget_s"):
        guard.score(v, [s("a")])
    with pytest.raises(VerifierBudgetExceeded):  # stays spent
        guard.score(v, [s("a")])


def test_repeated_failures_spend_the_error_budget(guard):
    v = guard.open("import os\ndef verify(prompt, completion):\n    os._exit(3)\n", max_failures=1)
    assert guard.score(v, [s("a")])[1] == ["verifier process died (exit code 3)"]
    with pytest.raises(VerifierBudgetExceeded, match="2 sandbox failures.*exit code 3"):
        guard.score(v, [s("a")])


def test_ignoring_sigterm_does_not_help(guard):
    src = """
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        def verify(prompt, completion):
            if completion == "x":
                time.sleep(30)
            return 1.0
    """
    v = guard.open(src, timeout_s=0.5)
    assert guard.score(v, [s("x")])[1] == ["timeout after 0.5s"]
    recovers(guard, v)


# ----------------------------------------------------------------------------- resources


def test_memory_bomb(guard):
    src = when_x("b = [b'x' * (1 << 24) for _ in range(10**6)]")
    # Filling the 1 GiB address space takes about a second here, many more on a loaded CI
    # host (stop 28 timed out at 5 s): the budget is wide, the outcome must be MemoryError.
    v = guard.open(src, timeout_s=60)
    scores, errors = guard.score(v, [s("x"), s("ok")])
    assert scores[0] is None and errors[0].startswith("MemoryError")
    recovers(guard, v)


@pytest.mark.parametrize(
    "attack",
    [
        "os.fork()",
        "subprocess.run(['/bin/sh', '-c', 'echo hi'])",
        "subprocess.run([sys.executable, '-c', 'pass'])",
        "threading.Thread(target=time.sleep, args=(9,)).start()",
        "os.execv(sys.executable, [sys.executable, '-c', 'pass'])",
    ],
)
def test_no_new_processes_or_threads(guard, attack):
    src = when_x(attack)
    v = guard.open(src)
    scores, errors = guard.score(v, [s("x"), s("ok")])
    assert scores == [None, 1.0], errors
    assert errors[0].split(":")[0] in {
        "PermissionError",
        "BlockingIOError",
        "FileNotFoundError",
        "RuntimeError",
    }


def test_fork_bomb(guard):
    src = """
        import os
        def verify(prompt, completion):
            n = 0
            for _ in range(100):
                try:
                    if os.fork() == 0:
                        while True:
                            os.fork()
                    n += 1
                except OSError:
                    pass
            return float(n)
    """
    v = guard.open(src, score_range=[0, 1000])
    assert guard.score(v, [s("x")]) == ([0.0], [None])


def test_huge_output_and_forged_frames(guard):
    src = """
        import os, sys
        def verify(prompt, completion):
            sys.stdout.write("1.0\\n" * 2_000_000)
            os.write(2, b"\\x00\\x00\\x00\\x10" + b'{"v": 1.0}' * 100_000)
            print('{"n": "", "b": 1, "r": [[0, "v", 1.0]]}')
            return 0.25
    """
    v = guard.open(src, timeout_s=5)
    assert guard.score(v, [s("a"), s("b")]) == ([0.25, 0.25], [None, None])


def test_write_outside_tmp_never_reaches_the_host(guard, tmp_path):
    marker = f"grpo-attack-{os.getpid()}"
    targets = [str(tmp_path / marker), f"/opt/{marker}", f"/root/{marker}", f"/{marker}"]
    src = f"""
        def verify(prompt, completion):
            if completion == "tmp":
                with open("/tmp/{marker}", "w") as f:
                    f.write("x")
                return 1.0
            with open(completion, "w") as f:
                f.write("x")
            return 1.0
    """
    v = guard.open(src)
    scores, errors = guard.score(v, [s(t) for t in targets] + [s("tmp")])
    assert scores == [None] * len(targets) + [1.0], errors
    allowed = {"FileNotFoundError", "PermissionError", "OSError"}
    assert all(e.split(":")[0] in allowed for e in errors[:-1])
    for t in targets + [f"/tmp/{marker}"]:
        assert not Path(t).exists(), t


def test_root_and_dev_are_read_only_mounts(guard):
    """bwrap makes / and /dev as unbounded tmpfs, owned by the sandbox uid in a user namespace
    (non-root workers): files there would hold host memory past every rlimit. Only the sized
    /tmp is writable; device nodes still work."""
    src = """
        import os
        def verify(prompt, completion):
            if completion == "devnull":
                with open("/dev/null", "w") as f:
                    f.write("x")
                return 1.0
            return float(bool(os.statvfs(completion).f_flag & os.ST_RDONLY))
    """
    v = guard.open(src)
    paths = ["/", "/dev", "/dev/shm", "/opt/grpo-verifier", "/tmp"]
    scores, errors = guard.score(v, [s(p) for p in paths] + [s("devnull")])
    assert errors == [None] * 6
    assert scores == [1.0, 1.0, 1.0, 1.0, 0.0, 1.0]


# ----------------------------------------------------------------------------- memory

SYSV_SHM = """
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmat.restype = ctypes.c_void_p
    libc.shmdt.argtypes = [ctypes.c_void_p]
    IPC_PRIVATE, IPC_CREAT, SEGMENT = 0, 0o1000, 256 << 20
    def verify(prompt, completion):
        if completion == "segments":  # what this sandbox's IPC namespace still holds
            with open("/proc/sysvipc/shm") as f:
                return float(len(f.read().splitlines()) - 1)
        if completion != "attack":
            return 1.0
        for _ in range(6):  # 1.5 GB, past the 1 GiB RLIMIT_AS, each detached once touched
            shmid = libc.shmget(IPC_PRIVATE, SEGMENT, IPC_CREAT | 0o600)
            if shmid < 0:
                raise OSError(ctypes.get_errno(), "shmget")
            addr = libc.shmat(shmid, None, 0)
            if addr is None or addr == ctypes.c_void_p(-1).value:
                raise OSError(ctypes.get_errno(), "shmat")
            ctypes.memset(addr, 1, SEGMENT)
            libc.shmdt(addr)
        return 1.0
"""


def _host_shmem_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("Shmem:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no Shmem in /proc/meminfo")


def test_sysv_shared_memory_cannot_hold_memory_past_the_limit(guard):
    """The reproduction: 6 x 256 MB of SysV shared memory, detached after use, used to stay
    allocated past RLIMIT_AS until the sandbox died. shmget is now denied."""
    v = guard.open(SYSV_SHM, timeout_s=20, score_range=[0, 100])
    before = _host_shmem_bytes()
    scores, errors = guard.score(v, [s("attack"), s("segments")])
    assert scores[0] is None and errors[0] == "PermissionError: [Errno 1] shmget", errors
    assert scores[1] == 0.0  # no segment left in the sandbox's IPC namespace
    assert _host_shmem_bytes() - before < 256 << 20  # (was +1536 MB)
    recovers(guard, v)


@pytest.mark.parametrize(
    "call",
    [
        "libc.shmget(0, 4096, 0o1600)",
        "libc.shmat(0, None, 0)",
        "libc.shmctl(0, 0, None)",
        "libc.semget(0, 1, 0o1600)",
        "libc.msgget(0, 0o1600)",
        "libc.syscall(319, b'x', 0)",  # memfd_create
        "libc.syscall(240, b'/q', 0o100, 0o600, None)",  # mq_open
    ],
)
def test_ipc_and_anonymous_shared_memory_are_denied(guard, call):
    src = f"""
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        def verify(prompt, completion):
            rc = {call}
            return float(ctypes.get_errno()) if rc == -1 else -1.0
    """
    v = guard.open(src, score_range=[-1, 100])
    assert guard.score(v, [s("a")]) == ([1.0], [None])  # EPERM


def test_os_memfd_create_is_a_clean_permission_error(guard):
    v = guard.open(when_x("os.memfd_create('x')"))
    scores, errors = guard.score(v, [s("x"), s("ok")])
    assert scores == [None, 1.0] and errors[0].startswith("PermissionError"), errors


# ----------------------------------------------------------------------------- secrets


def test_secrets_files_and_network_are_out_of_reach(guard):
    src = f"""
        import os, glob, socket
        DIRS = ("tmp", "dev", "proc", "usr", "lib", "lib64", "opt", "root")
        def leaks(path):
            try:
                with open(path, "rb") as f:
                    return {SECRET!r}.encode() in f.read()
            except OSError:
                return False
        def connect(host, port):
            try:
                socket.create_connection((host, port), timeout=0.2).close()
                return True
            except OSError:
                return False
        def verify(prompt, completion, path=None):
            if completion == "env":
                procs = glob.glob("/proc/*/environ")
                return float(any(leaks(p) for p in procs) or {SECRET!r} in str(os.environ))
            if completion == "file":
                return float(os.path.exists(path) or leaks(path))
            if completion == "net":
                targets = [("127.0.0.1", 5432), ("127.0.0.1", 6379), ("1.1.1.1", 53)]
                return float(any(connect(h, p) for h, p in targets))
            if completion == "listing":
                seen = set(os.listdir("/")) - set(DIRS)
                return float(len(seen)) + float(os.path.exists("/etc/passwd"))
    """
    v = guard.open(src, score_range=[0, 100])
    paths = ["/etc/passwd", "/etc/shadow", str(guard.dataset), str(guard.data_dir),
             os.path.abspath("pyproject.toml"), "/proc/1/root/etc/passwd"]  # fmt: skip
    samples = [s("env"), s("net"), s("listing")] + [s("file", path=p) for p in paths]
    scores, errors = guard.score(v, samples)
    assert errors == [None] * len(samples)
    assert scores == [0.0] * len(samples)


def test_identity_capabilities_and_seccomp(guard):
    src = """
        import os
        def verify(prompt, completion):
            status = dict(
                line.split(":\\t", 1) for line in open("/proc/self/status").read().splitlines()
                if ":\\t" in line
            )
            checks = [
                os.getuid() == os.geteuid() == 65534,
                os.getgid() == 65534 and os.getgroups() == [],
                status["CapEff"].strip() == status["CapPrm"].strip() == "0" * 16,
                status["NoNewPrivs"].strip() == "1",
                status["Seccomp"].strip() == "2",
                os.getcwd() == "/tmp",
            ]
            return float(sum(checks))
    """
    v = guard.open(src, score_range=[0, 10])
    assert guard.score(v, [s("a")]) == ([6.0], [None])


def test_ctypes_and_raw_syscalls_are_filtered(guard):
    src = """
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        def verify(prompt, completion):
            nr = {"socket": 41, "ptrace": 101, "mount": 165, "unshare": 272, "clone3": 435}
            args = {"socket": (2, 1, 0), "ptrace": (16, 1, 0, 0), "unshare": (0x20000,)}
            rc = libc.syscall(nr[completion], *args.get(completion, (0, 0, 0, 0, 0)))
            return float(ctypes.get_errno()) if rc == -1 else -1.0
    """
    v = guard.open(src, score_range=[-1, 100])
    names = ("socket", "ptrace", "mount", "unshare", "clone3")
    scores, errors = guard.score(v, [s(n) for n in names])
    assert errors == [None] * 5
    assert scores == [1.0, 1.0, 1.0, 1.0, 38.0]  # EPERM x4, ENOSYS for clone3


# ----------------------------------------------------------------------------- crashes


@pytest.mark.parametrize(
    "attack, fragment",
    [
        ("os._exit(0)", "verifier process died (exit code 0)"),
        ("raise SystemExit(7)", "SystemExit: 7"),
        ("raise KeyboardInterrupt", "KeyboardInterrupt"),
        ("ctypes.string_at(1)", "SIGSEGV"),
        # no C recursion for Python calls in 3.11: runs into the memory limit or the deadline
        ("sys.setrecursionlimit(10**7); f = lambda n: f(n + 1); f(0)", ""),
        ("f = lambda n: f(n + 1); f(0)", "RecursionError"),
        ("os.kill(os.getpid(), 9)", "SIGKILL"),
    ],
)
def test_crashes_are_reported_and_contained(guard, attack, fragment):
    src = when_x(attack)
    v = guard.open(src)
    scores, errors = guard.score(v, [s("ok"), s("x")])
    assert scores == [1.0, None] and fragment in errors[1], errors
    recovers(guard, v)


@pytest.mark.parametrize(
    "expr", ["float('nan')", "float('inf')", "'1.0'", "None", "10**400", "[1]"]
)
def test_bad_return_values_are_errors(guard, expr):
    v = guard.open(
        f"def verify(prompt, completion):\n    return {expr} if completion == 'x' else 1\n"
    )
    scores, errors = guard.score(v, [s("x")])
    assert scores == [None] and errors[0]
    recovers(guard, v)


def test_huge_int_within_float_range_is_clamped(guard):
    v = guard.open("def verify(prompt, completion):\n    return 2**70\n")
    assert guard.score(v, [s("x")]) == ([1.0], [None])
