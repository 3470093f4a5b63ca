from tests.client.shared import clientside, trained  # noqa: F401  (fixtures)
from tests.ui.browser import browser, chromium  # noqa: F401  (fixtures)
