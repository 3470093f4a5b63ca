import os
import textwrap
import time

import pytest

from workers.verifiers import Verifier, open_verifier
from workers.verifiers.python_kind import PythonVerifier
from workers.verifiers.sandbox import CHILD_ENV


def verifier(source: str, **config) -> PythonVerifier:
    v = open_verifier("python", {"source": textwrap.dedent(source), **config}, name="t")
    assert isinstance(v, PythonVerifier) and isinstance(v, Verifier)
    return v


def s(completion, **fields):
    return {"prompt": "What is 6*7?", "completion": completion, **fields}


def test_scores_a_batch_with_fields_as_kwargs():
    src = """
        def verify(prompt, completion, answer, **fields):
            assert prompt == "What is 6*7?"
            return 1.0 if completion.strip() == str(answer) else 0.0
    """
    with verifier(src) as v:
        scores, errors = v.score([s("42", answer=42), s("41", answer=42), s(" 7 ", answer="7")])
    assert scores == [1.0, 0.0, 1.0]
    assert errors == [None, None, None]


def test_extra_fields_are_not_forced_on_a_narrow_signature():
    src = """
        def verify(prompt, completion, answer):
            return float(completion == answer)
    """
    with verifier(src) as v:
        assert v.score([s("1", answer="1", id=9, split="train")]) == ([1.0], [None])


def test_chat_prompt_is_passed_through():
    src = """
        def verify(prompt, completion, **kw):
            return 1.0 if prompt[-1]["role"] == "user" and kw == {"answer": "x"} else 0.0
    """
    sample = {"prompt": [{"role": "user", "content": "hi"}], "completion": "x", "answer": "x"}
    with verifier(src) as v:
        assert v.score([sample]) == ([1.0], [None])


def test_openai_grade_form():
    src = """
        def grade(sample, item):
            assert "completion" not in item and item["prompt"] == "What is 6*7?"
            return 1.0 if sample["output_text"] == item["reference_answer"] else 0.0
    """
    with verifier(src) as v:
        scores, errors = v.score([s("42", reference_answer="42"), s("4", reference_answer="42")])
    assert (scores, errors) == ([1.0, 0.0], [None, None])


def test_exception_in_one_item_others_score():
    src = """
        def verify(prompt, completion, **kw):
            if completion == "bad":
                raise ZeroDivisionError("no " + "x" * 2000)
            if completion == "exit":
                raise SystemExit(3)
            return 0.5
    """
    with verifier(src) as v:
        scores, errors = v.score([s("ok"), s("bad"), s("exit"), s("ok")])
    assert scores == [0.5, None, None, 0.5]
    assert errors[0] is None and errors[3] is None
    assert errors[1].startswith("ZeroDivisionError: no xxx") and len(errors[1]) <= 500
    assert errors[2].startswith("SystemExit")


@pytest.mark.parametrize(
    "expr, fragment",
    [
        ("float('nan')", "NaN"),
        ("float('inf')", "inf"),
        ("'1.0'", "str"),
        ("True", "bool"),
        ("None", "None"),
        ("[1.0]", "list"),
        ("10**400", "OverflowError"),
    ],
)
def test_non_numbers_are_errors(expr, fragment):
    with verifier(f"def verify(prompt, completion):\n    return {expr}\n") as v:
        scores, errors = v.score([s("x")])
    assert scores == [None]
    assert fragment in errors[0]
    if fragment != "OverflowError":
        assert errors[0].startswith("verify returned")


def test_other_number_types_are_accepted():
    src = """
        from fractions import Fraction
        from decimal import Decimal
        def verify(prompt, completion):
            return {"i": 1, "f": Fraction(1, 4), "d": Decimal("0.5")}[completion]
    """
    with verifier(src) as v:
        assert v.score([s("i"), s("f"), s("d")]) == ([1.0, 0.25, 0.5], [None, None, None])


def test_out_of_range_is_clamped():
    with verifier("def verify(prompt, completion):\n    return float(completion)\n") as v:
        assert v.score([s("5"), s("-2"), s("0.25")])[0] == [1.0, 0.0, 0.25]
    cfg = {"score_range": [-1, 2]}
    with verifier("def verify(prompt, completion):\n    return float(completion)\n", **cfg) as v:
        assert v.score([s("5"), s("-2"), s("0.25")])[0] == [2.0, -1.0, 0.25]


def test_printed_or_written_fake_frames_cannot_forge_scores():
    # Every channel the user code can reach without digging into the bootstrap's frames:
    # print() to stdout/stderr, raw writes on fds 1 and 2, and fake frames (right shape, guessed
    # nonce) written on every other open fd, which includes the result pipe.
    src = """
        import json, os, sys
        def frame(obj):
            data = json.dumps(obj).encode()
            return len(data).to_bytes(4, "big") + data
        def verify(prompt, completion, **kw):
            fakes = b"".join(
                frame({"n": n, "b": b, "i": i, "v": 1.0})
                for n in ("", "0" * 32, None) for b in (1, 2) for i in range(3)
            ) + frame({"n": "0" * 32, "b": 1, "done": True})
            print(fakes.decode("latin-1"))
            print('{"n": "", "b": 1, "i": 0, "v": 1.0}')
            sys.stdout.buffer.write(fakes) if hasattr(sys.stdout, "buffer") else None
            sys.stdout.flush()
            print("1.0", file=sys.stderr)
            for fd in (1, 2):
                os.write(fd, fakes)
            if completion == "all-fds":
                for fd in range(3, 256):
                    try:
                        os.write(fd, fakes)
                    except OSError:
                        pass
            return 0.0
    """
    with verifier(src) as v:
        scores, errors = v.score([s("x"), s("y"), s("z")])
        assert scores == [0.0, 0.0, 0.0] and errors == [None] * 3
        scores, errors = v.score([s("x"), s("all-fds"), s("z")])
        assert scores[0] == 0.0  # answered before the forgery
        assert scores[1:] == [None, None]  # the forged frames are rejected, never accepted
        assert all("protocol" in e for e in errors[1:])
        # the verifier recovers with a fresh child
        scores, errors = v.score([s("x")])
        assert scores == [0.0] and errors == [None]


def test_infinite_loop_times_out_and_next_batch_works():
    src = """
        def verify(prompt, completion):
            while completion == "loop":
                pass
            return 1.0
    """
    with verifier(src, timeout_s=1) as v:
        start = time.monotonic()
        scores, errors = v.score([s("ok"), s("loop"), s("ok")])
        elapsed = time.monotonic() - start
        assert elapsed < 2.0
        assert scores == [1.0, None, None]
        assert errors[1] == errors[2] == "timeout after 1s"
        assert v.stats.timeouts == 1
        assert v.score([s("ok"), s("ok")]) == ([1.0, 1.0], [None, None])
        assert v.stats.spawns == 2


def test_timeout_while_loading_module():
    with verifier("while True:\n    pass\ndef verify(p, c):\n    return 1\n", timeout_s=0.5) as v:
        start = time.monotonic()
        scores, errors = v.score([s("a")])
        assert time.monotonic() - start < 1.5
        assert scores == [None] and errors == ["timeout after 0.5s"]


def test_os_exit_then_respawn():
    src = """
        import os
        def verify(prompt, completion):
            if completion == "die":
                os._exit(1)
            return 1.0
    """
    with verifier(src) as v:
        scores, errors = v.score([s("ok"), s("die"), s("ok")])
        assert scores == [1.0, None, None]
        assert errors[1] == errors[2] == "verifier process died (exit code 1)"
        assert v.score([s("ok")]) == ([1.0], [None])
        assert v.stats.crashes == 1 and v.stats.spawns == 2


def test_segfault_then_respawn():
    src = """
        import ctypes
        def verify(prompt, completion):
            if completion == "segv":
                ctypes.string_at(0)
            return 1.0
    """
    with verifier(src) as v:
        scores, errors = v.score([s("segv")])
        assert scores == [None] and "SIGSEGV" in errors[0]
        assert v.score([s("ok")]) == ([1.0], [None])


def test_memory_limit():
    src = """
        def verify(prompt, completion):
            if completion == "big":
                x = bytearray(4 * 1024 ** 3)
            return 1.0
    """
    with verifier(src) as v:
        scores, errors = v.score([s("big"), s("ok")])
    assert scores == [None, 1.0]
    assert errors[0].startswith("MemoryError")


def test_rlimits_are_set_before_user_code():
    src = """
        import resource
        LIMITS = {
            name: resource.getrlimit(getattr(resource, name))
            for name in ("RLIMIT_AS", "RLIMIT_FSIZE", "RLIMIT_NOFILE", "RLIMIT_CORE", "RLIMIT_CPU")
        }
        def verify(prompt, completion):
            soft, hard = LIMITS[completion]
            return float(soft)
    """
    cfg = {"score_range": [0, 1e12]}
    with verifier(src, **cfg) as v:
        scores, errors = v.score([s(n) for n in ("RLIMIT_AS", "RLIMIT_FSIZE", "RLIMIT_NOFILE")])
        assert errors == [None] * 3
        assert scores == [float(1 << 30), float(1 << 20), 64.0]
        assert v.score([s("RLIMIT_CORE")])[0] == [0.0]
        assert 0 < v.score([s("RLIMIT_CPU")])[0][0] <= 3600


def test_child_environment_is_clean(monkeypatch):
    monkeypatch.setenv("GRPO_SECRET_TEST", "x")
    src = """
        import os, sys
        def verify(prompt, completion):
            if completion == "env":
                return 1.0 if "GRPO_SECRET_TEST" in os.environ else 0.0
            if completion == "keys":
                return float(len(set(os.environ) - ALLOWED))
            if completion == "cwd":
                return 1.0 if os.listdir(".") == [] and os.getcwd() != START else 0.0
            if completion == "project":
                return 1.0 if any("site-packages" in p for p in sys.path) else 0.0
            if completion == "stdout":
                return 1.0 if os.path.realpath("/proc/self/fd/1") == "/dev/null" else 0.0
    """
    allowed = {"PATH", "LANG", "LC_CTYPE", "PWD", *CHILD_ENV}
    head = f"import os, sys\nSTART = {os.getcwd()!r}\nALLOWED = {allowed!r}"
    src = textwrap.dedent(src).replace("import os, sys", head)
    with verifier(src, score_range=[0, 100]) as v:
        scores, errors = v.score([s("env"), s("keys"), s("cwd"), s("project"), s("stdout")])
    assert errors == [None] * 5
    assert scores == [0.0, 0.0, 1.0, 0.0, 1.0]


def test_state_persists_within_one_verifier():
    src = """
        calls = 0
        def verify(prompt, completion):
            global calls
            calls += 1
            return calls
    """
    with verifier(src, score_range=[0, 100]) as v:
        assert v.score([s("a"), s("b")])[0] == [1.0, 2.0]
        assert v.score([s("c")])[0] == [3.0]
        assert v.stats.spawns == 1
    with verifier(src, score_range=[0, 100]) as v:  # a new verifier starts fresh
        assert v.score([s("a")])[0] == [1.0]


def test_child_started_lazily_and_stopped_on_close():
    v = verifier("def verify(prompt, completion):\n    return 1.0\n")
    assert v._child is None
    assert v.score([]) == ([], [])
    assert v._child is None
    v.score([s("a")])
    child = v._child
    assert child is not None and child.proc.poll() is None
    pid = child.proc.pid
    v.close()
    assert child.proc.returncode is not None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    with pytest.raises(RuntimeError):
        v.score([s("a")])


def test_load_error_is_reported_per_item():
    src = "import not_a_module_anywhere\ndef verify(p, c):\n    return 1\n"
    with verifier(src) as v:
        scores, errors = v.score([s("a"), s("b")])
    assert scores == [None, None]
    assert errors[0].startswith("verifier failed to load: ModuleNotFoundError")


def test_bad_samples_error_locally():
    with verifier("def verify(prompt, completion, **kw):\n    return 1.0\n") as v:
        scores, errors = v.score([s("a"), {"prompt": "p"}, s("b", blob=object()), s("c")])
    assert scores == [1.0, None, None, 1.0]
    assert "completion" in errors[1] and "JSON" in errors[2]


def test_large_batch_round_trip():
    src = "def verify(prompt, completion, answer):\n    return float(completion == answer)\n"
    big = "y" * 200_000  # bigger than a pipe buffer, both ways of the batch
    samples = [s(big if i % 2 else "x", answer="x") for i in range(64)]
    with verifier(src) as v:
        scores, errors = v.score(samples)
    assert scores == [0.0 if i % 2 else 1.0 for i in range(64)]
    assert errors == [None] * 64


def test_child_recycled_before_its_lifetime_cpu_cap():
    from workers.verifiers import ChildLimits

    src = "n = 0\ndef verify(prompt, completion):\n    global n\n    n += 1\n    return n\n"
    config = {"source": src, "timeout_s": 1, "score_range": [0, 100]}
    with open_verifier("python", config, limits=ChildLimits(cpu_s=3)) as v:
        # 2 * timeout + 2 s of CPU would overrun the 3 s cap: a fresh child for every batch
        assert v.score([s("a"), s("b")])[0] == [1.0, 2.0]
        assert v.score([s("a")])[0] == [1.0]
        assert v.stats.spawns == 2


@pytest.mark.parametrize(
    ("item", "error"),
    [([0, "v", 10**400], "returned a number out of range"),
     ([0, "v", 1e308 * 10], "expected a finite"),
     ([0, "v", "1"], "malformed result"), ([0, "v", True], "malformed result")],
)  # fmt: skip
def test_a_forged_result_frame_is_that_items_error(item: list, error: str) -> None:
    """Verifier code that reached the nonce can write any frame; the parent turns whatever
    number it holds into an item error, never an exception of its own (was an OverflowError)."""
    v = verifier("def verify(prompt, completion, **kw):\n    return 1.0\n")
    value, message = v._accept(item)
    assert value is None and message is not None and error in message


def test_a_deeply_nested_frame_is_a_protocol_error() -> None:
    from workers.verifiers import process

    child = process.Child.__new__(process.Child)
    child.nonce, child.buf = "n", bytearray()
    raw = b"[" * 100_000 + b"]" * 100_000
    child.buf += len(raw).to_bytes(4, "big") + raw
    with pytest.raises(process.ProtocolError, match="malformed frame"):
        list(child.frames())
