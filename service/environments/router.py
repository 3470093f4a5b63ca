"""Environments' routes: the four of every versioned resource (`service.registry.router`) and
`/test`."""

from service.environments import service
from service.environments.schemas import (
    EnvironmentCreate,
    EnvironmentOut,
    EnvironmentTestRequest,
    EnvironmentTestResult,
)
from service.environments.service import ENVIRONMENTS
from service.http.deps import SessionDep, SettingsDep, TenantDep
from service.http.limits import verifier_tests
from service.http.openapi import problems
from service.registry.router import version_router

router = version_router("/v1/environments", ENVIRONMENTS, EnvironmentCreate, EnvironmentOut)


@router.post(
    "/{name}/test", response_model=EnvironmentTestResult, responses=problems(404, 413, 429, 503)
)
def test_environment(
    name: str,
    body: EnvironmentTestRequest,
    session: SessionDep,
    tenant: TenantDep,
    settings: SettingsDep,
) -> EnvironmentTestResult:
    """Replay scripted assistant turns through exactly the episode loop training runs, the
    sandbox included: per sample the transcript, the per-turn rewards and their sum."""
    limit = settings.max_concurrent_tests_per_tenant
    with verifier_tests.hold(tenant, limit, "verifier, grader and environment tests"):
        row = ENVIRONMENTS.get(session, tenant, name, body.version)
        return service.run_test(session, row, body)
