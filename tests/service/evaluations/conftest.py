from tests.service.jobs.conftest import db_url, sessions  # noqa: F401  (the same databases)
