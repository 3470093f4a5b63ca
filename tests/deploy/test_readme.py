"""The configuration reference (docs/configuration.md) stays in step with the settings class:
every field documented, and nothing that does not exist."""

from __future__ import annotations

import re
from pathlib import Path

from service.settings import Settings

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_the_configuration_reference_matches_the_settings_class() -> None:
    documented = set(re.findall(r"^\| `(GRPO_[A-Z0-9_]+)` \|", REFERENCE.read_text(), re.MULTILINE))
    fields = {f"GRPO_{name.upper()}" for name in Settings.model_fields}
    assert documented == fields, (
        f"missing: {sorted(fields - documented)}, unknown: {sorted(documented - fields)}"
    )
