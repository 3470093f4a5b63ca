"""The README's Python client block, run as written against a real service: after `grpo login`,
as the quickstart has the user do, it trains the tiny model and downloads the checkpoint.

The block's 30 steps take about two minutes on a shared CPU; the test asks for 10 through the
`STEPS` variable the block honours. That its verifier learns is shown by `make demo`'s test
(tests/e2e/test_demo.py, 30 steps, the same settings): here its scores are checked to be the
demo verifier's."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from service.demo_task import DIGIT_VERIFIER_SOURCE
from tests.e2e.services import RunningService

README = Path(__file__).resolve().parents[2] / "README.md"
STEPS = 10


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


def test_the_readmes_python_block_runs_as_written(
    embedded_service: RunningService, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_")}
    env |= {"XDG_CONFIG_HOME": str(tmp_path / "config"), "STEPS": str(STEPS)}  # no profile yet
    key = embedded_service.new_key("readme-reader")
    login = [sys.executable, "-m", "grpo_client", "login"]
    subprocess.run(
        [*login, "--url", embedded_service.base_url, "--api-key", key],
        env=env, check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", readme_python_block()],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "[1.0]" in out and "checkpoint: " in out, out  # the test score, progress printed
    assert re.search(r"reward [\d.]+ -> [\d.]+", out), out
    (tar,) = (tmp_path / "out").glob(f"job_*-step-{STEPS}.tar")
    assert tar.stat().st_size > 0
