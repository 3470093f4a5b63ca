"""Multi-turn environments through the API (issue 19): registered as immutable numbered
versions with the sha256 of their config, the source checked at registration (never run in
the API), `/test` replaying scripted turns through the training episode loop in the sandbox,
and jobs naming an environment (its version pinned in the stored spec)."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.api.conftest import tenant_client
from tests.api.helpers import error_paths, job_body, make_dataset, make_verifier, problem
from tests.e2e.services import RunningService

CALCULATOR = '''\
def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b

def divide(a: float, b: float) -> float:
    """Divide a by b."""
    return a / b

tools = [add, divide]

def step(messages, record):
    said = messages[-1]["content"]
    return {"observation": None, "reward": float(record["answer"] in said), "done": True}
'''
# Two turns: say the word, then say it again; each turn is rewarded on its own.
SAY_IT_AGAIN = """\
def reset(record):
    return "Say " + record["word"] + "."

def step(messages, record):
    said = [m["content"] for m in messages if m["role"] == "assistant"]
    reward = float(said[-1].strip() == record["word"])
    if len(said) == 1:
        return {"observation": "Say it again.", "reward": reward, "done": False}
    return {"observation": None, "reward": reward, "done": True}
"""
HANGS = "import time\n\ndef step(messages, record):\n    time.sleep(60)\n"
WRONG_SHAPE = "def step(messages, record):\n    return 1.0\n"
NEVER_DONE = (
    "def step(messages, record):\n"
    '    return {"observation": "more", "reward": 0.5, "done": False}\n'
)


@pytest.fixture(scope="module")
def client(api: RunningService) -> Iterator[httpx.Client]:
    """One tenant for the module's tests; names do not collide."""
    with tenant_client(api) as c:
        yield c


def _register(client: httpx.Client, name: str, source: str, **config: object) -> dict:
    body = {"name": name, "kind": "python", "config": {"source": source, **config}}
    r = client.post("/v1/environments", json=body)
    assert r.status_code == 201, r.text
    return r.json()


def _sha256(config: dict) -> str:
    canonical = json.dumps({"kind": "python", "config": config}, sort_keys=True,
                           separators=(",", ":"))  # fmt: skip
    return hashlib.sha256(canonical.encode()).hexdigest()


def _test(client: httpx.Client, name: str, samples: list[dict], **extra: object) -> dict:
    r = client.post(f"/v1/environments/{name}/test", json={"samples": samples, **extra},
                    timeout=120)  # fmt: skip
    assert r.status_code == 200, r.text
    return r.json()


def test_registration_versions_and_sha256(any_api: RunningService) -> None:
    client, stranger = tenant_client(any_api), tenant_client(any_api)
    first = _register(client, "calc", CALCULATOR)
    assert first["id"].startswith("env_") and first["version"] == 1
    assert first["config"] == {"source": CALCULATOR, "timeout_s": 10.0}  # the default, stored
    assert first["sha256"] == _sha256(first["config"])
    second = _register(client, "calc", CALCULATOR, timeout_s=5)
    assert second["version"] == 2 and second["sha256"] == _sha256(second["config"])
    assert second["sha256"] != first["sha256"]
    assert client.get("/v1/environments/calc").json() == second
    assert client.get("/v1/environments/calc/versions/1").json() == first
    problem(client.get("/v1/environments/calc/versions/3"), 404)
    page = client.get("/v1/environments", params={"limit": 1}).json()
    assert [e["version"] for e in page["data"]] == [2] and page["has_more"]
    rest = client.get("/v1/environments", params={"after": page["next"]}).json()
    assert [e["version"] for e in rest["data"]] == [1] and not rest["has_more"]
    assert stranger.get("/v1/environments").json()["data"] == []
    # Posting the same name in another tenant starts at version 1: names are per tenant.
    assert _register(stranger, "calc", CALCULATOR)["version"] == 1


BAD_SOURCES = [
    ("def step(messages, record)\n    return {}\n", "$.config.source", "line 1"),
    ("def reset(record):\n    return 'hi'\n", "$.config.source", "step(messages, record)"),
    ("step = lambda m, r: {}\n", "$.config.source", "plain function"),
    ("def step(messages):\n    return {}\n", "$.config.source", "called as `step(messages,"),
    ("def reset():\n    return ''\ndef step(m, r):\n    return {}\n", "$.config.source",
     "reset(record)"),
    ("def t(x: int):\n    return x\ntools = [t]\ndef step(m, r):\n    return {}\n",
     "$.config.source", "needs a docstring"),
    ('def t(x):\n    """T."""\n    return x\ntools = [t]\ndef step(m, r):\n    return {}\n',
     "$.config.source", "needs a type hint"),
    ("tools = ['add']\ndef step(m, r):\n    return {}\n", "$.config.source", "by name"),
    ("x = 1\0\ndef step(m, r):\n    return {}\n", "$.config.source", "NUL"),
]  # fmt: skip


@pytest.mark.parametrize(("source", "path", "reason"), BAD_SOURCES)
def test_every_bad_source_is_a_422_naming_the_source(
    client: httpx.Client, source: str, path: str, reason: str
) -> None:
    body = {"name": "bad", "kind": "python", "config": {"source": source}}
    r = client.post("/v1/environments", json=body)
    problem(r, 422)
    assert error_paths(r) == [path], r.text
    assert reason in r.json()["errors"][0]["message"], r.text
    problem(client.get("/v1/environments/bad"), 404)  # nothing was stored


def test_a_bad_config_or_kind_names_the_field(client: httpx.Client) -> None:
    cases = [
        ({"source": WRONG_SHAPE, "timeout_s": 0}, "python", ["$.config.timeout_s"]),
        ({"source": WRONG_SHAPE, "extra": 1}, "python", ["$.config.extra"]),
        ({"source": 42}, "python", ["$.config.source"]),
        ({}, "python", ["$.config.source"]),
        ({"source": WRONG_SHAPE}, "regex", ["$.kind"]),
    ]
    for config, kind, paths in cases:
        r = client.post("/v1/environments", json={"name": "b", "kind": kind, "config": config})
        problem(r, 422)
        assert error_paths(r) == paths, r.text
    source = "x = '" + "a" * (256 * 1024) + "'\ndef step(m, r):\n    return {}\n"
    r = client.post("/v1/environments", json={"name": "big", "kind": "python",
                                              "config": {"source": source}})  # fmt: skip
    assert error_paths(r) == ["$.config.source"] and "262144 characters" in r.text


def test_a_calculator_episode_calls_its_tools(client: httpx.Client) -> None:
    _register(client, "calc", CALCULATOR)
    call = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    broken = '<tool_call>{"name": "divide", "arguments": {"a": 1, "b": 0}}</tool_call>'
    samples = [
        {"record": {"prompt": "What is 2+3?", "answer": "5"}, "turns": [call, "It is 5."]},
        {"record": {"prompt": "1/0?", "answer": "none"}, "turns": [broken, "<tool_call>{",
                                                                   "No idea."]},
    ]  # fmt: skip
    body = _test(client, "calc", samples)
    solved, failed = body["results"]
    assert [m["role"] for m in solved["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert solved["messages"][0]["content"] == "What is 2+3?"
    tool = solved["messages"][2]
    assert tool["name"] == "add" and json.loads(tool["content"]) == 5
    assert solved["rewards"] == [1.0] and solved["reward"] == 1.0 and solved["errors"] == []
    assert solved["turns"] == 2 and solved["tool_calls"] == 1 and solved["tool_errors"] == 0
    # A tool that raises and a malformed call answer as tool messages: the episode goes on.
    assert [m["role"] for m in failed["messages"]] == ["user", "assistant", "tool", "assistant",
                                                       "tool", "assistant"]  # fmt: skip
    assert "ZeroDivisionError" in failed["messages"][2]["content"]
    assert failed["tool_calls"] == 2 and failed["tool_errors"] == 2
    assert failed["rewards"] == [0.0] and failed["errors"] == []


def test_say_it_again_returns_the_transcript_and_per_turn_rewards(client: httpx.Client) -> None:
    _register(client, "again", SAY_IT_AGAIN)
    samples = [
        {"record": {"word": "hello"}, "turns": ["hello", "hello"]},
        {"record": {"word": "hello"}, "turns": ["hello", "goodbye"]},
        {"record": {"word": "hello"}, "turns": ["hello"]},  # out of turns: the episode ends
    ]
    first, second, short = _test(client, "again", samples)["results"]
    assert first["messages"] == [
        {"role": "user", "content": "Say hello."},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "Say it again."},
        {"role": "assistant", "content": "hello"},
    ]
    assert first["rewards"] == [1.0, 1.0] and first["reward"] == 2.0
    assert second["rewards"] == [1.0, 0.0] and second["reward"] == 1.0
    assert short["rewards"] == [1.0] and short["turns"] == 1 and not short["truncated"]
    # max_turns cuts the episode: truncated, one reward.
    (cut,) = _test(client, "again", samples[:1], max_turns=1)["results"]
    assert cut["rewards"] == [1.0] and cut["truncated"] and cut["turns"] == 1


def test_bad_behaviour_at_run_time_is_an_episode_error(client: httpx.Client) -> None:
    _register(client, "shape", WRONG_SHAPE)
    _register(client, "endless", NEVER_DONE)
    (wrong,) = _test(client, "shape", [{"record": {"prompt": "p"}, "turns": ["a"]}])["results"]
    assert wrong["rewards"] == [] and wrong["reward"] == 0.0
    assert wrong["errors"] and wrong["errors"][0].startswith("step failed:"), wrong
    # A record the default reset cannot use: that sample's error, not the call's.
    sample = {"record": {"prompt": "p"}, "turns": ["a", "b", "c"]}
    no_prompt, endless = _test(client, "endless", [{"record": {}, "turns": ["a"]}, sample],
                               max_turns=2)["results"]  # fmt: skip
    assert no_prompt["messages"] == [] and "prompt" in no_prompt["errors"][0]
    assert endless["truncated"] and endless["turns"] == 2 and endless["rewards"] == [0.5, 0.5]


def test_test_requests_are_bounded(client: httpx.Client) -> None:
    _register(client, "again", SAY_IT_AGAIN)
    sample = {"record": {"word": "x"}, "turns": ["x"]}
    cases = [
        ({"samples": []}, "$.samples"),
        ({"samples": [sample] * 65}, "$.samples"),
        ({"samples": [{"record": {}, "turns": ["x"] * 65}]}, "$.samples[0].turns"),
        ({"samples": [{"record": {}, "turns": []}]}, "$.samples[0].turns"),
        ({"samples": [sample], "max_turns": 65}, "$.max_turns"),
        ({"samples": [{"record": {}, "turns": ["x" * 100_001]}]}, "$.samples[0].turns[0]"),
    ]
    for body, path in cases:
        r = client.post("/v1/environments/again/test", json=body)
        problem(r, 422)
        assert error_paths(r) == [path], r.text
    problem(client.post("/v1/environments/again/test", json={"samples": [sample],
                                                            "version": 99}), 404)  # fmt: skip
    problem(client.post("/v1/environments/nobody/test", json={"samples": [sample]}), 404)


def test_a_hanging_step_answers_within_its_deadline_while_healthz_answers(
    api: RunningService, client: httpx.Client
) -> None:
    timeout_s = 5.0
    _register(client, "hangs", HANGS, timeout_s=timeout_s)
    answered: list[tuple[float, float]] = []  # (when, latency) of each /healthz
    done = threading.Event()

    def probe() -> None:
        while not done.is_set():
            start = time.monotonic()
            assert api.client(None).get("/healthz", timeout=30).status_code == 200
            answered.append((time.monotonic(), time.monotonic() - start))
            time.sleep(0.1)

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        start = time.monotonic()
        body = _test(client, "hangs", [{"record": {"prompt": "p"}, "turns": ["a"]}])
        end = time.monotonic()
    finally:
        done.set()
        prober.join()
    (episode,) = body["results"]
    assert episode["rewards"] == [] and "timeout" in episode["errors"][0], episode
    assert timeout_s <= end - start < timeout_s + 25, end - start  # + the sandbox's start
    # The API answered while the step hung: probes came back during the call, none of them
    # held up for as long as the hang (a blocked event loop would hold one for all of it).
    during = [latency for when, latency in answered if start < when < end]
    assert len(during) >= 2 and max(during) < timeout_s - 1, answered


def test_a_job_names_an_environment_and_pins_its_version(api: RunningService) -> None:
    owner, stranger = tenant_client(api), tenant_client(api)
    _register(owner, "again", SAY_IT_AGAIN)
    latest = _register(owner, "again", SAY_IT_AGAIN, timeout_s=3)
    ds = make_dataset(owner)
    body = job_body(ds, environment={"name": "again", "max_turns": 2})
    del body["verifiers"]  # an environment alone scores the episodes
    r = owner.post("/v1/jobs", json=body)
    assert r.status_code == 201, r.text
    spec = r.json()["spec"]
    assert spec["environment"] == {"name": "again", "version": 2, "max_turns": 2}
    assert spec["environment_sha256"] == latest["sha256"] and spec["verifiers"] == []
    make_verifier(owner)  # "em": verifiers may score the final transcript too
    pinned = job_body(ds, environment={"name": "again", "version": 1, "max_turns": 3})
    r = owner.post("/v1/jobs", json=pinned)
    assert r.status_code == 201, r.text
    assert r.json()["spec"]["environment"]["version"] == 1
    assert [v["name"] for v in r.json()["spec"]["verifiers"]] == ["em"]

    # A missing version, a missing name and another tenant's environment: the same 422.
    r = owner.post("/v1/jobs", json={**body, "environment": {"name": "again", "version": 3}})
    assert error_paths(problem(r, 422) and r) == ["$.environment.name"]
    assert r.json()["errors"][0]["message"] == "no environment again version 3"
    stranger_ds = make_dataset(stranger)
    missing = stranger.post("/v1/jobs", json={**body, "dataset": stranger_ds,
                                              "environment": {"name": "nobody"}})  # fmt: skip
    foreign = stranger.post("/v1/jobs", json={**body, "dataset": stranger_ds})
    assert error_paths(problem(missing, 422) and missing) == ["$.environment.name"]
    assert error_paths(problem(foreign, 422) and foreign) == ["$.environment.name"]
    assert foreign.json()["errors"][0]["message"] == "no environment again"
    assert missing.json()["detail"].replace("nobody", "again") == foreign.json()["detail"]

    # Neither verifiers nor an environment: nothing would score the completions.
    del body["environment"]
    for no_reward in (body, {**body, "verifiers": []}):
        r = owner.post("/v1/jobs", json=no_reward)
        assert error_paths(problem(r, 422) and r) == ["$.verifiers"]
        assert "or name an `environment`" in r.json()["errors"][0]["message"]
