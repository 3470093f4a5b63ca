"""Where the CLI finds the server and the key: options, then GRPO_URL / GRPO_API_KEY, then the
file `grpo login` writes (`config.json` in the user's config dir, mode 0600; README.md says
where)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import typer

DEFAULT_URL = "http://127.0.0.1:8000"


def config_path() -> Path:
    """`$XDG_CONFIG_HOME/grpo/config.json` when XDG_CONFIG_HOME is set, on any system (click
    reads it on Linux only); else click's app dir: `~/.config/grpo` on Linux,
    `~/Library/Application Support/grpo` on macOS, `%APPDATA%\\grpo` on Windows."""
    xdg = os.environ.get("XDG_CONFIG_HOME")
    if xdg:
        return Path(xdg) / "grpo" / "config.json"
    return Path(typer.get_app_dir("grpo")) / "config.json"


@dataclass
class Profile:
    url: str
    api_key: str | None
    source: str  # where the key came from: "option", "env", "file" or "none"


def load_file() -> dict[str, str]:
    path = config_path()
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read {path}: {exc}; run `grpo login` again") from None
    return {k: str(v) for k, v in data.items() if k in ("url", "api_key") and v}


def save_file(url: str, api_key: str) -> Path:
    """Write the profile readable by its owner only (0600, folder 0700), atomically."""
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        os.fchmod(fh.fileno(), 0o600)
        json.dump({"url": url, "api_key": api_key}, fh)
    os.replace(tmp, path)
    return path


def resolve(url: str | None = None, api_key: str | None = None) -> Profile:
    stored = load_file()
    resolved_url = url or os.environ.get("GRPO_URL") or stored.get("url") or DEFAULT_URL
    if api_key:
        return Profile(resolved_url, api_key, "option")
    if os.environ.get("GRPO_API_KEY"):
        return Profile(resolved_url, os.environ["GRPO_API_KEY"], "env")
    if stored.get("api_key"):
        return Profile(resolved_url, stored["api_key"], "file")
    return Profile(resolved_url, None, "none")
