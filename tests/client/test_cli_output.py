"""The `grpo` CLI's help and output as a user and a script see them (no service needed)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

TABLE = """
from grpo_client.cli_base import out, table
out.print(table(["id", "name"], [["job_1", "n" * 150]]))
"""


def _run(*args: str, env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, *args], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout


def test_without_a_terminal_tables_are_not_cut_at_80_columns() -> None:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}  # stdout is a pipe here
    shown = _run("-c", TABLE, env=env)
    assert "n" * 150 in shown, shown  # one whole line, neither folded nor cut with "…"
    narrow = _run("-c", TABLE, env={**env, "COLUMNS": "60"})  # COLUMNS still wins
    assert "n" * 150 not in narrow and max(len(line) for line in narrow.splitlines()) <= 60


def test_jobs_help_shows_the_whole_summary_of_create() -> None:
    shown = _run("-m", "grpo_client", "jobs", "--help", env={**os.environ, "COLUMNS": "200"})
    (create,) = re.findall(r"│ create +(.*?) *│", shown)
    assert create.endswith("docs/api.md#job-spec)."), create  # not cut at "for example:"


def test_watch_prints_a_flat_reward_warning_as_a_line_of_its_own() -> None:
    from datetime import UTC, datetime

    from rich.console import Console

    from grpo_client.models import EventOut
    from grpo_client.watch import event_line

    message = "steps 1-3: 100% of the groups scored alike"
    event = EventOut(id=7, at=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), type="warning",
                     message=message, data={"reason": "flat_rewards", "step": 3})  # fmt: skip
    console = Console(record=True, width=200, color_system="truecolor", force_terminal=True)
    console.print(event_line(event))
    assert console.export_text(clear=False).strip() == f"03:04:05 warning: {message}"
    assert "\x1b[33m" in console.export_text(styles=True)  # yellow, as warnings are


def test_the_login_profile_is_under_xdg_config_home_on_every_system(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from grpo_client import config

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    for platform in ("linux", "darwin"):  # click's own app dir reads it on Linux only
        monkeypatch.setattr(sys, "platform", platform)
        assert config.config_path() == tmp_path / "xdg" / "grpo" / "config.json"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert config.config_path() == tmp_path / "Library/Application Support/grpo/config.json"
    monkeypatch.setattr(sys, "platform", "linux")
    assert config.config_path() == tmp_path / ".config" / "grpo" / "config.json"


def test_login_help_says_where_the_profile_goes() -> None:
    shown = _run("-m", "grpo_client", "login", "--help", env={**os.environ, "COLUMNS": "200"})
    flat = " ".join(shown.replace("│", " ").split())
    assert "$XDG_CONFIG_HOME/grpo/config.json, else ~/.config/grpo/config.json on Linux" in flat
