"""OpenAI's grader endpoints, for the official `openai` SDK's `fine_tuning.alpha.graders`."""

from fastapi import APIRouter

from service.graders import service
from service.graders.schemas import (
    GraderRunRequest,
    GraderRunResponse,
    GraderValidateRequest,
    GraderValidateResponse,
)
from service.http.deps import SessionDep, SettingsDep, TenantDep
from service.http.limits import verifier_tests
from service.http.openapi import problems

router = APIRouter(
    prefix="/v1/fine_tuning/alpha/graders",
    tags=["graders"],
    responses=problems(400, 401, 422, 500),
)


@router.post("/validate", response_model=GraderValidateResponse)
def validate_grader(
    body: GraderValidateRequest, session: SessionDep, tenant: TenantDep, settings: SettingsDep
) -> GraderValidateResponse:
    return GraderValidateResponse(
        grader=service.validate_grader(session, settings, tenant, body.grader)
    )


# A plain `def`: FastAPI runs it on its threadpool, so tenant code never blocks the event loop.
@router.post("/run", response_model=GraderRunResponse, responses=problems(429, 503))
def run_grader(
    body: GraderRunRequest, session: SessionDep, tenant: TenantDep, settings: SettingsDep
) -> GraderRunResponse:
    limit = settings.max_concurrent_tests_per_tenant
    with verifier_tests.hold(tenant, limit, "verifier tests and grader runs"):
        return service.run_grader(session, tenant, body, settings)
