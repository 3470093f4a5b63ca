from tests.client.shared import clientside, trained  # noqa: F401  (fixtures)
