from tests.service.jobs.conftest import db_url, sessions

__all__ = ["db_url", "sessions"]
