"""A fresh SQLite file and a fresh PostgreSQL database at head, as the jobs' unit tests have."""

from tests.service.jobs.conftest import db_url, sessions

__all__ = ["db_url", "sessions"]
