"""The rollouts hook: one row per completion of every step and eval run, on both backends."""

from __future__ import annotations

from collections import defaultdict

import pytest

from tests.workers.grpo.helpers import small_spec
from workers.grpo.rollout_rows import ROW_KEYS
from workers.grpo.trainer import TrainHooks, train

MAX_NEW = 5
RECORDS = [{"prompt": f"Digit {d}:", "digit": d} for d in range(6)]
EVAL_RECORDS = [
    {"prompt": [{"role": "system", "content": "Count."}, {"role": "user", "content": "1 2"}]},
    {"prompt": "Digit 9:", "digit": 9},
]


class DigitOrError:
    """Scores the share of the record's digit in the completion; no score (an error) for a
    record without a digit, so the rows' `errors` have something to report."""

    name, weight = "digit", 2.0

    def score(self, samples: list[dict]) -> tuple[list[float | None], list[str | None]]:
        scores: list[float | None] = []
        errors: list[str | None] = []
        for s in samples:
            if "digit" not in s:
                scores.append(None)
                errors.append("record has no digit")
                continue
            text = s["completion"]
            scores.append(sum(c == str(s["digit"]) for c in text) / max(1, len(text)))
            errors.append(None)
        return scores, errors


def _run(tiny_model, tmp_path, spec: dict) -> list[tuple[int, str, list[dict]]]:
    calls: list[tuple[int, str, list[dict]]] = []
    hooks = TrainHooks(on_rollouts=lambda step, split, rows: calls.append((step, split, rows)))
    spec = small_spec(
        tiny_model, steps=2, prompts_per_step=3, group_size=4, max_new_tokens=MAX_NEW,
        spec={"eval_every": 1, **spec},
    )  # fmt: skip
    train(spec, RECORDS, [DigitOrError()], tmp_path, hooks, eval_records=EVAL_RECORDS)
    return calls


@pytest.fixture(scope="module", params=["fast", "reference"])
def calls(request, tiny_model, tmp_path_factory) -> list[tuple[int, str, list[dict]]]:
    # Gradient checkpointing needs the model's own forward: the reference backend.
    spec = {"gradient_checkpointing": request.param == "reference"}
    return _run(tiny_model, tmp_path_factory.mktemp("rollouts"), spec)


def test_one_call_per_step_and_eval_run(calls):
    assert [(step, split) for step, split, _ in calls] == [
        (1, "train"), (1, "eval"), (2, "train"), (2, "eval"),
    ]  # fmt: skip
    for step, split, rows in calls:
        assert all(list(r) == list(ROW_KEYS) for r in rows)
        assert {r["step"] for r in rows} == {step} and {r["split"] for r in rows} == {split}


def test_train_rows_are_the_groups_of_the_step(calls):
    for _, split, rows in calls:
        if split != "train":
            continue
        pairs = [(g, j) for g in range(3) for j in range(4)]
        assert [(r["group"], r["index"]) for r in rows] == pairs
        by_group = defaultdict(list)
        for r in rows:
            by_group[r["group"]].append(r)
            assert r["prompt"] == RECORDS[r["record"]]["prompt"]  # the record it came from
            assert r["messages"] is None and r["errors"] == {}
            assert r["reward"] == pytest.approx(2.0 * r["scores"]["digit"])  # weight 2
        for group in by_group.values():
            assert len({r["record"] for r in group}) == 1  # one prompt per group
            assert sum(r["advantage"] for r in group) == pytest.approx(0.0, abs=1e-5)
            rewards = [r["reward"] for r in group]
            if max(rewards) > min(rewards):  # a spread: the best gets the largest advantage
                best = max(group, key=lambda r: r["reward"])
                assert best["advantage"] == max(r["advantage"] for r in group) > 0


def test_lengths_truncation_and_finish_reason_agree(calls):
    rows = [r for _, _, rs in calls for r in rs]
    for r in rows:
        assert 1 <= r["length"] <= MAX_NEW
        assert r["finish_reason"] == ("length" if r["truncated"] else "stop")
        if r["truncated"]:
            assert r["length"] == MAX_NEW


def test_eval_rows_keep_chat_messages_and_verifier_errors(calls):
    _, _, rows = calls[1]
    chat, plain = rows
    assert [(r["group"], r["index"], r["record"]) for r in rows] == [(0, 0, 0), (1, 0, 1)]
    assert chat["messages"] == EVAL_RECORDS[0]["prompt"]
    assert chat["prompt"] == "Count.\n1 2"  # the tiny tokenizer has no chat template
    assert chat["scores"] == {"digit": None} and chat["errors"] == {"digit": "record has no digit"}
    assert chat["reward"] == 0.0 and chat["advantage"] is None
    assert plain["messages"] is None and plain["errors"] == {} and plain["advantage"] is None
    assert plain["scores"]["digit"] is not None


def test_refilled_groups_name_the_records_they_came_from(tiny_model, tmp_path):
    # Dynamic sampling puts groups drawn later into flat slots: the row still names its record.
    calls = _run(tiny_model, tmp_path, {"grpo": {
        "steps": 2, "prompts_per_step": 3, "group_size": 4, "learning_rate": 3e-3,
        "skip_zero_std_groups": True, "max_resample_rounds": 2,
    }})  # fmt: skip
    train_rows = [r for _, split, rows in calls if split == "train" for r in rows]
    assert len(train_rows) == 2 * 3 * 4
    assert all(r["prompt"] == RECORDS[r["record"]]["prompt"] for r in train_rows)
