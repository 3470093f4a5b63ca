"""Per-tenant storage quotas: datasets (count and bytes), verifier and environment versions,
rollout bytes.
Checked in the transaction that adds the row; two uploads racing at the limit may both pass
(the counts are read, not locked), which bounds the overshoot by the tenant's concurrency."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.core.problems import ProblemError, too_large
from service.models import Dataset, EnvironmentVersion, Job, RolloutFile, VerifierVersion
from service.settings import Settings


def _over_quota(detail: str) -> ProblemError:
    # Not a rate: waiting does not help, deleting does. No Retry-After.
    return ProblemError(429, "Too Many Requests", detail)


def check_dataset_quota(session: Session, settings: Settings, tenant_id: str, size: int) -> None:
    count, stored = session.execute(
        select(func.count(), func.coalesce(func.sum(Dataset.size_bytes), 0)).where(
            Dataset.tenant_id == tenant_id, Dataset.deleted_at.is_(None)
        )
    ).one()
    if count >= settings.max_datasets_per_tenant:
        raise _over_quota(
            f"you have {count} datasets, the most a tenant may keep "
            f"({settings.max_datasets_per_tenant}): delete some (DELETE /v1/datasets/{{id}})"
        )
    limit, stored = settings.max_dataset_bytes_per_tenant, int(stored or 0)
    if stored + size > limit:
        raise too_large(
            f"this dataset ({size} bytes) would bring your datasets to {stored + size} bytes, "
            f"over the {limit} bytes a tenant may keep: delete some (DELETE /v1/datasets/{{id}})"
        )


def check_verifier_quota(session: Session, settings: Settings, tenant_id: str) -> None:
    limit = settings.max_verifier_versions_per_tenant
    _check_version_quota(session, VerifierVersion, tenant_id, limit, "verifier")


def check_environment_quota(session: Session, settings: Settings, tenant_id: str) -> None:
    limit = settings.max_environment_versions_per_tenant
    _check_version_quota(session, EnvironmentVersion, tenant_id, limit, "environment")


def _check_version_quota(
    session: Session,
    model: type[VerifierVersion] | type[EnvironmentVersion],
    tenant_id: str,
    limit: int,
    what: str,
) -> None:
    count = session.scalar(select(func.count()).where(model.tenant_id == tenant_id))
    if count is not None and count >= limit:
        raise _over_quota(f"you have {count} {what} versions, the most a tenant may keep ({limit})")


def rollout_bytes_fit(session: Session, settings: Settings, tenant_id: str, size: int) -> bool:
    """Whether `size` more bytes of rollouts keep the tenant within its quota (0: no quota).
    Checked by the worker before it stores a step: over it, the job trains on, unrecorded."""
    limit = settings.max_rollout_bytes_per_tenant
    if not limit:
        return True
    stored = session.scalar(
        select(func.coalesce(func.sum(RolloutFile.size_bytes), 0))
        .join(Job, Job.id == RolloutFile.job_id)
        .where(Job.tenant_id == tenant_id)
    )
    return int(stored or 0) + size <= limit
