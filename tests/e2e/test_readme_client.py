"""The README's Python client block trains with the demo's verifier: its scores are the demo
verifier's. (The block itself runs as written in tests/e2e/test_docs_blocks.py.)"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from service.demo_task import DIGIT_VERIFIER_SOURCE

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_python_block() -> str:
    section = README.read_text().split("## Python client", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match is not None, "no python block under ## Python client"
    return match.group(1)


def _verify_function(source: str) -> Callable[..., float]:
    namespace: dict[str, object] = {}
    exec(source, namespace)  # our own README's and demo's verifier sources
    verify = namespace["verify"]
    assert callable(verify)
    return verify


@pytest.mark.parametrize("completion", ["", "7", "77", "7a", "123", "hello", "7 7 7", "0"])
def test_the_readmes_verifier_is_the_demos_which_learns(completion: str) -> None:
    namespace: dict[str, object] = {}
    exec(readme_python_block().split("with Client()", 1)[0].replace("from grpo_client", "#"),
         namespace)  # fmt: skip
    readme = _verify_function(str(namespace["VERIFIER"]))
    demo = _verify_function(DIGIT_VERIFIER_SOURCE)
    sample = {"prompt": "Digit 7:", "completion": completion, "digit": 7}
    assert readme(**sample) == pytest.approx(demo(**sample))
