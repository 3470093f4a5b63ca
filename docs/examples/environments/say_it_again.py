"""A two-turn environment: the model answers, is told "Say it again.", and answers once more.

Each turn earns the share of its characters that are the record's digit (records look like
{"prompt": "Digit 7:", "digit": 7}), so a model learns to answer with that digit, twice.
"""


def _share(text, digit):
    return sum(c == digit for c in text) / max(1, len(text))


def step(messages, record):
    turns = [m["content"] for m in messages if m["role"] == "assistant"]
    reward = _share(turns[-1], str(record["digit"]))
    if len(turns) == 1:
        return {"observation": "Say it again.", "reward": reward, "done": False}
    return {"observation": None, "reward": reward, "done": True}
