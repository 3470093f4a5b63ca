"""stop notifying on every job UPDATE: the status-poll cache that listened is gone (issue 32)

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-04 04:00:00

Revision 0015 made PostgreSQL `pg_notify` the job's id after every UPDATE or DELETE of `jobs`
(a training step updates its job's row), for an answer cache in each API process. The status
poll now reads the row like every other route, and no one listens: the trigger and its
function go. The downgrade puts them back as 0015 made them. PostgreSQL only, as 0015.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

CHANNEL = "grpo_job_changed"


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP TRIGGER IF EXISTS jobs_notify_changed ON jobs")
    op.execute("DROP FUNCTION IF EXISTS grpo_notify_job_changed()")


def downgrade() -> None:
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
