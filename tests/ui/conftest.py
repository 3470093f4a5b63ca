from tests.client.shared import clientside, trained  # noqa: F401  (fixtures)
from tests.ui.browser import browser  # noqa: F401  (fixture)
