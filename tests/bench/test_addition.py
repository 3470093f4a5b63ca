"""The addition task of bench/real_model.py: its verifier and its data, without a model."""

from __future__ import annotations

from bench.addition import addition_reward, addition_sets, last_integer


def test_the_verifier_reads_the_last_integer() -> None:
    assert addition_reward("37 + 45 = 82", 82) == 1.0
    assert addition_reward("The answer is 82.", 82) == 1.0
    assert addition_reward("82, or rather 83", 82) == 0.0  # the last integer counts
    assert addition_reward("To add 37 and 45, we", 82) == 0.0
    assert addition_reward("", 82) == 0.0
    assert last_integer("1,024 apples") == 1024


def test_a_conversational_completion_is_scored_on_its_text() -> None:
    # TRL hands a chat-prompt dataset's completions over as messages
    assert addition_reward([{"role": "assistant", "content": "It is 82"}], 82) == 1.0
    assert addition_reward([{"role": "assistant", "content": "It is 81"}], 82) == 0.0


def test_the_held_out_sums_are_apart_from_the_training_sums() -> None:
    train, held = addition_sets(400, 100)
    assert (len(train), len(held)) == (400, 100)
    text = [r["prompt"][0]["content"] for r in train]
    held_text = [r["prompt"][0]["content"] for r in held]
    assert not set(text) & set(held_text)
    assert len(set(text)) == 400 and len(set(held_text)) == 100
    assert addition_sets(400, 100) == (train, held)  # the same data for every seed and side
    a, b = (int(x) for x in held_text[0].split("?")[0].removeprefix("What is ").split(" + "))
    assert held[0]["answer"] == a + b and 10 <= a <= 99 and 10 <= b <= 99
    assert held[0]["prompt"][0]["role"] == "user"
