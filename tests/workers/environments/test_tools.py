"""Tool-call parsing (Hermes/Qwen tags, Llama 3 JSON) and argument checks against schemas."""

from workers.environments import parse_tool_calls
from workers.environments.tools import check_arguments

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": ["integer", "null"]}},
            "required": ["a"],
        },
    },
}
TOOLS = [ADD]


def test_hermes_calls_several_per_turn_with_deterministic_ids():
    text = (
        'Let me add. <tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
        '<tool_call>{"name": "add", "arguments": "{\\"a\\": 2.5}"}</tool_call>'
    )
    calls = parse_tool_calls(text, TOOLS, call_id="call_3")
    assert [(c.name, c.arguments, c.id, c.error) for c in calls] == [
        ("add", {"a": 1, "b": 2}, "call_3_0", None),
        ("add", {"a": 2.5}, "call_3_1", None),
    ]


def test_an_unclosed_last_tag_runs_to_the_end_of_the_turn():
    [call] = parse_tool_calls('<tool_call>{"name": "add", "arguments": {"a": 1}}', TOOLS)
    assert call.error is None and call.arguments == {"a": 1}


def test_llama3_json_with_and_without_python_tag():
    [call] = parse_tool_calls('<|python_tag|>{"name": "add", "parameters": {"a": 4}}', TOOLS)
    assert (call.name, call.arguments, call.error) == ("add", {"a": 4}, None)
    [call] = parse_tool_calls(' {"name": "add", "parameters": {"a": 4, "b": null}} ', TOOLS)
    assert call.error is None and call.arguments == {"a": 4, "b": None}


def test_plain_text_and_plain_json_answers_call_nothing():
    assert parse_tool_calls("The answer is 5.", TOOLS) == []
    assert parse_tool_calls('{"answer": 5}', TOOLS) == []
    assert parse_tool_calls('{"name": "add", "parameters": {}}', []) == []  # no tools at all


def test_bad_calls_become_errors_not_exceptions():
    cases = {
        "<tool_call>{not json}</tool_call>": "not valid JSON",
        "<tool_call>[1, 2]</tool_call>": "must be a JSON object",
        '<tool_call>{"name": "mul", "arguments": {}}</tool_call>': "unknown tool 'mul'",
        '<tool_call>{"name": "add", "arguments": {}}</tool_call>': "missing 'a'",
        '<tool_call>{"name": "add", "arguments": {"a": 1, "c": 1}}</tool_call>': "unexpected 'c'",
        '<tool_call>{"name": "add", "arguments": {"a": "1"}}</tool_call>': "'a' must be number",
        '<tool_call>{"name": "add", "arguments": {"a":1,"b":0.5}}</tool_call>': "integer or null",
        '<tool_call>{"name": "add", "arguments": "{bad"}</tool_call>': "are not valid JSON",
        '<tool_call>{"name": "add", "arguments": [1]}</tool_call>': "must be a JSON object",
        "<|python_tag|>{broken": "not valid JSON",
    }
    for text, message in cases.items():
        [call] = parse_tool_calls(text, TOOLS)
        assert call.error is not None and message in call.error, (text, call.error)


def test_too_many_calls_in_one_turn_are_refused_past_the_cap():
    text = '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>' * 18
    calls = parse_tool_calls(text, TOOLS)
    assert len(calls) == 18
    assert [c.error is None for c in calls] == [True] * 16 + [False] * 2


def test_argument_checks_cover_enum_arrays_and_objects():
    schema = {
        "type": "object",
        "properties": {
            "op": {"enum": ["+", "-"]},
            "xs": {"type": "array", "items": {"type": "integer"}},
            "kw": {"type": "object", "additionalProperties": {"type": "string"}},
            "flag": {"type": "boolean"},
        },
        "required": [],
    }
    assert (
        check_arguments({"op": "+", "xs": [1, 2], "kw": {"a": "b"}, "flag": True}, schema) is None
    )
    assert "one of" in check_arguments({"op": "*"}, schema)
    assert check_arguments({"xs": [1, "2"]}, schema) is not None
    assert check_arguments({"kw": {"a": 1}}, schema) is not None
    assert check_arguments({"flag": 1}, schema) is not None
    assert check_arguments({"xs": [True]}, schema) is not None  # a bool is not an integer
