"""Built-in kinds score in a helper process under a per-batch deadline (issue 22 item 1, issue
16 item 8): a pathological input that spins in C with the GIL held is cut off at the deadline
with a per-item error, the rest of the batch keeps its scores, a fresh helper serves the next
batch, and nothing of it stalls the calling process's threads."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from workers.verifiers import BuiltinHost, VerifierBudgetExceeded, open_verifier
from workers.verifiers.builtin_host import MAX_FAILURES
from workers.verifiers.factory import in_process_verifier

# Python `re` backtracks cubically over the spaces in the numeric kind's LaTeX clean-up, in C,
# holding the GIL: ~0.3 s at 800 spaces on the development machine, ~20 s at 3,000.
SLOW_FRAC = "\\frac{" + " " * 6000
# anyOf of two $refs over an array nested N deep: 2**N validations (7 s at 16 levels).
NESTED = {"$defs": {"x": {"type": "array", "items": {"anyOf": [{"$ref": "#/$defs/x"},
                                                             {"$ref": "#/$defs/x"}]}}},
          "$ref": "#/$defs/x"}  # fmt: skip
DEEP = "[" * 40 + "1" + "]" * 40


def sample(completion: str, **fields: object) -> dict[str, object]:
    return {"prompt": "p", "completion": completion, **fields}


def test_a_pathological_numeric_input_is_cut_off_at_the_deadline() -> None:
    host = BuiltinHost(timeout_s=1.0)
    with open_verifier("numeric", {}, name="num", host=host) as v:
        batch = [sample("42", answer=42), sample(SLOW_FRAC, answer=1), sample("7", answer=7)]
        start = time.monotonic()
        scores, errors = v.score(batch)
        elapsed = time.monotonic() - start
        assert scores == [1.0, None, None]
        assert errors[0] is None
        assert errors[1] is not None and errors[1].startswith("timeout: the batch did not finish")
        assert "1s" in errors[1] and "GRPO_BUILTIN_VERIFIER_TIMEOUT_S" in errors[1]
        assert errors[2] is not None and errors[2].startswith("not scored: item 1")
        assert elapsed < 3.0, elapsed  # the deadline, plus killing and reaping the helper
        assert v.score([sample("3", answer=3)]) == ([1.0], [None])  # a fresh helper
    assert host.spawns == 2
    host.close()


def test_a_json_schema_anyof_explosion_is_cut_off_at_the_deadline() -> None:
    with open_verifier("json_schema", {"schema": NESTED}, name="js") as v:
        v.host.timeout_s = 1.0  # type: ignore[attr-defined]
        start = time.monotonic()
        scores, errors = v.score([sample("[[]]"), sample(DEEP)])
        assert time.monotonic() - start < 3.0
    assert scores == [1.0, None] and errors[0] is None
    assert errors[1] is not None and "timeout" in errors[1]


def test_the_calling_process_keeps_its_gil_while_the_helper_spins() -> None:
    """What a heartbeat thread beside the verifier sees: in-process, the C loop starves it for
    the whole call; through the helper it keeps ticking."""
    gaps: list[float] = []
    stop = threading.Event()

    def tick() -> None:
        last = time.monotonic()
        while not stop.wait(0.05):
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    ticker = threading.Thread(target=tick)
    ticker.start()
    try:
        with open_verifier("numeric", {}, name="num", host=BuiltinHost(timeout_s=2.0)) as v:
            _, errors = v.score([sample(SLOW_FRAC, answer=1)])
    finally:
        stop.set()
        ticker.join()
    assert errors[0] is not None and "timeout" in errors[0]
    assert max(gaps) < 0.5, max(gaps)


def test_repeated_timeouts_spend_the_verifier_budget() -> None:
    host = BuiltinHost(timeout_s=0.2)
    with open_verifier("numeric", {}, name="num", host=host) as v:
        for _ in range(MAX_FAILURES):
            assert v.score([sample(SLOW_FRAC, answer=1)])[0] == [None]
        with pytest.raises(VerifierBudgetExceeded, match="num.*11 batches of the numeric kind"):
            v.score([sample(SLOW_FRAC, answer=1)])
    host.close()


def test_a_composite_of_built_in_parts_uses_one_helper() -> None:
    table = {
        "re": (1, "regex", {"pattern": "^a+$"}),
        "num": (1, "numeric", {}),
        "len": (1, "length", {"target": 1}),
    }
    config = {"parts": [{"name": n, "version": 1} for n in table]}
    with open_verifier("composite", config, resolve=lambda n, _v: table[n]) as v:
        scores, errors = v.score([sample("a", answer=1), sample("aa", answer=2)])
        hosts = {id(verifier.host) for _, _, verifier in v.parts}  # type: ignore[attr-defined]
        assert len(hosts) == 1
        (host,) = {verifier.host for _, _, verifier in v.parts}  # type: ignore[attr-defined]
        assert host.spawns == 1
    assert scores == [2.0, 1.99] and errors == [None, None]
    assert host._helper is None  # closed with the composite


KIND_CASES = [
    ("exact_match", {"field": "answer", "normalize_whitespace": True},
     [sample(" 4 ", answer="4"), sample("5", answer="4"), sample("x")]),
    ("regex", {"pattern": r"(\d+)", "field": "answer", "group": 1},
     [sample("is 12", answer="12"), sample("none", answer="1"), {"completion": 3}]),
    ("numeric", {"tolerance": 0.01},
     [sample("\\boxed{3/4}", answer=0.75), sample("1", answer="x")]),
    ("json_schema", {"schema": {"type": "object", "required": ["a"]}},
     [sample('{"a": 1}'), sample("```json\n{\"b\": 2}\n```"), sample("no")]),
    ("length", {"target": 3}, [sample("abc"), sample("abcdefgh"), 7]),
]  # fmt: skip


@pytest.mark.parametrize(("kind", "config", "samples"), KIND_CASES)
def test_every_built_in_kind_scores_as_it_does_in_process(
    kind: str, config: dict[str, object], samples: list[object]
) -> None:
    with open_verifier(kind, config, name=kind) as hosted:
        assert hosted.score(samples) == in_process_verifier(kind, config, kind).score(samples)  # type: ignore[arg-type]


def test_the_helper_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    """A training process killed by the watchdog takes its spinning helper with it."""
    script = tmp_path / "owner.py"
    script.write_text(
        textwrap.dedent(f"""
        import sys
        from workers.verifiers import BuiltinHost, open_verifier
        host = BuiltinHost(timeout_s=600)
        with open_verifier("numeric", {{}}, host=host) as v:
            v.score([{{"prompt": "p", "completion": "1", "answer": 1}}])
            print(host._helper.proc.pid, flush=True)
            v.score([{{"prompt": "p", "completion": {SLOW_FRAC!r} * 4, "answer": 1}}])
    """)
    )
    owner = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    helper = int(owner.stdout.readline())
    time.sleep(0.5)  # spinning now
    os.kill(owner.pid, signal.SIGKILL)
    owner.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _alive(helper):
        time.sleep(0.05)
    assert not _alive(helper)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
