"""docs/tinker.md's first example, run as written against the real API and tinker worker (the
tiny model in place of the catalog's): it works, and the SDK warns about none of its calls."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.api.server import run_api
from tests.e2e.services import TINY, RunningService, stop_all
from tests.e2e.test_tinker_sdk import start_worker

DOC = Path(__file__).resolve().parents[2] / "docs" / "tinker.md"


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[RunningService]:
    env = {"GRPO_TINKER_LONG_POLL_S": "1", "GRPO_TINKER_WORKER_POLL_S": "0.05"}
    with run_api(env, tmp_path_factory.mktemp("tinker-docs"), tiny_model_dir) as svc:
        svc.procs.append(start_worker(svc))
        try:
            yield svc
        finally:
            stop_all(svc.procs[1:], timeout=20)


def test_the_first_example_runs_without_a_future_warning(api: RunningService) -> None:
    example = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)[0]
    key = api.new_key("tinker-docs")
    program = (
        example.replace("http://127.0.0.1:8000", api.base_url)
        .replace('"grpo_sk_..."', repr(key))
        .replace('"qwen2.5-0.5b"', repr(TINY))
    )
    assert api.base_url in program and key in program and TINY in program  # all three found
    program += "\nprint('sampled', len(samples))\nservice.close('success').result()\n"
    done = subprocess.run(
        [sys.executable, "-W", "error::FutureWarning", "-c", program],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert f"['{TINY}']" in done.stdout and "sampled 4" in done.stdout, done.stdout
