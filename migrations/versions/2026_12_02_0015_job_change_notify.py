"""notify the API's status-poll cache when a job row changes (issue 21)

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02 15:00:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The API's status-poll cache listened on this channel (gone, and the trigger dropped by 0017);
# the payload is the job's id. PostgreSQL only: SQLite (embedded mode) has no notifications.
CHANNEL = "grpo_job_changed"


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(
        f"""
        CREATE FUNCTION grpo_notify_job_changed() RETURNS trigger AS $$
        BEGIN
            PERFORM pg_notify('{CHANNEL}', OLD.id);
            RETURN NULL;
        END
        $$ LANGUAGE plpgsql
        """
    )
    op.execute(
        "CREATE TRIGGER jobs_notify_changed AFTER UPDATE OR DELETE ON jobs "
        "FOR EACH ROW EXECUTE FUNCTION grpo_notify_job_changed()"
    )


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP TRIGGER IF EXISTS jobs_notify_changed ON jobs")
    op.execute("DROP FUNCTION IF EXISTS grpo_notify_job_changed()")
