"""The README's configuration reference stays in step with the settings class: every field
documented, and nothing that does not exist."""

from __future__ import annotations

import re
from pathlib import Path

from service.settings import Settings

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_configuration_table_matches_the_settings_class() -> None:
    documented = set(re.findall(r"^\| `(GRPO_[A-Z0-9_]+)` \|", README.read_text(), re.MULTILINE))
    fields = {f"GRPO_{name.upper()}" for name in Settings.model_fields}
    assert documented == fields, (
        f"missing: {sorted(fields - documented)}, unknown: {sorted(documented - fields)}"
    )
