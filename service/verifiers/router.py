"""Verifiers' routes: the four of every versioned resource (`service.registry.router`) and
`/test`."""

from service.http.deps import SessionDep, SettingsDep, TenantDep
from service.http.limits import verifier_tests
from service.http.openapi import problems
from service.registry.router import version_router
from service.verifiers import service
from service.verifiers.limits import check_test_cap
from service.verifiers.schemas import (
    VerifierCreate,
    VerifierOut,
    VerifierTestRequest,
    VerifierTestResult,
)
from service.verifiers.service import VERIFIERS

router = version_router("/v1/verifiers", VERIFIERS, VerifierCreate, VerifierOut)


@router.post("/{name}/test", response_model=VerifierTestResult, responses=problems(404, 413))
def test_verifier(
    name: str,
    body: VerifierTestRequest,
    session: SessionDep,
    tenant: TenantDep,
    settings: SettingsDep,
) -> VerifierTestResult:
    limit = settings.max_concurrent_tests_per_tenant
    with verifier_tests.hold(tenant, limit, "verifier tests"):
        row = VERIFIERS.get(session, tenant, name, body.version)
        check_test_cap(row.kind, row.config, service.make_resolver(session, tenant), settings)
        return service.run_test(session, row, body, settings)
