"""A calculator-tool environment: the model may call `add`, then answers.

Records look like {"prompt": "What is 3+4?", "a": 3, "b": 4}. The answer (the first turn that
calls no tool) earns the share of its characters that are digits of a + b; a model learns to
answer with them, using the tool's output if it called it.
"""


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


tools = [add]


def step(messages, record):
    answer = messages[-1]["content"]
    digits = str(record["a"] + record["b"])
    reward = sum(c in digits for c in answer) / max(1, len(answer))
    return {"observation": None, "reward": reward, "done": True}
