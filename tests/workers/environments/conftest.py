import pytest

from workers.verifiers import sandbox_mode


@pytest.fixture(autouse=True, scope="session")
def _sandboxed() -> None:
    """Environments run in the python verifiers' sandbox: bubblewrap must work (CI installs it
    through .ci/ensure-services.sh). Failing beats silently testing the unsafe mode."""
    mode = sandbox_mode()
    assert mode == "bubblewrap", f"environment tests need a working bubblewrap (mode: {mode})"
