"""The router of a versioned resource, with the routes every one has: create (a new version
of a name), list, the latest version of a name, and one exact version. The domain adds its
own (`/test`) to it. Each route keeps the name it would have had written by hand
(`create_verifier`, ...): the OpenAPI operation ids and summaries do not change.

No `from __future__ import annotations` here: FastAPI reads the body and response types off
the annotations of functions made inside `version_router`, which must be real classes.
"""

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from sqlalchemy import select

from service.core.pagination import MAX_INT, Page, PageDep, paginate
from service.http.deps import SessionDep, SettingsDep, TenantDep
from service.http.idempotency import Idempotent, IdempotentRoute
from service.http.openapi import problems
from service.registry.schemas import VersionCreate, VersionOut
from service.registry.service import Registry


def version_router(
    prefix: str,
    registry: Registry[Any],
    create_schema: type[VersionCreate],
    out_schema: type[VersionOut],
) -> APIRouter:
    """`prefix` is `/v1/<plural>`; the plural is the OpenAPI tag too."""
    model, what = registry.model, registry.what
    router = APIRouter(
        prefix=prefix,
        tags=[prefix.rsplit("/", 1)[-1]],
        route_class=IdempotentRoute,
        responses=problems(400, 401, 422, 500),
    )

    def out(row: Any) -> VersionOut:
        return out_schema.model_validate(row, from_attributes=True)

    # FastAPI reads these annotations at run time: the domain's own schemas, which a static
    # checker cannot see through the factory's arguments.
    def create(
        body: create_schema,  # type: ignore[valid-type]
        session: SessionDep,
        tenant: TenantDep,
        settings: SettingsDep,
    ) -> VersionOut:
        return out(registry.create(session, tenant, body, settings))

    def list_versions(
        session: SessionDep,
        tenant: TenantDep,
        page: PageDep,
        name: Annotated[str | None, Query(description="Only versions of this name.")] = None,
    ) -> Page[Any]:
        stmt = select(model).where(model.tenant_id == tenant)
        if name:
            stmt = stmt.where(model.name == name)
        rows, has_more, nxt = paginate(session, stmt, model.id, page)
        page_type = Page[out_schema]  # type: ignore[valid-type]
        return page_type(data=[out(r) for r in rows], has_more=has_more, next=nxt)

    def get_latest(name: str, session: SessionDep, tenant: TenantDep) -> VersionOut:
        return out(registry.get(session, tenant, name))

    def get_version(
        name: str,
        version: Annotated[int, Path(ge=1, le=MAX_INT)],
        session: SessionDep,
        tenant: TenantDep,
    ) -> VersionOut:
        return out(registry.get(session, tenant, name, version))

    router.add_api_route(
        "",
        create,
        methods=["POST"],
        name=f"create_{what}",
        status_code=201,
        response_model=out_schema,
        dependencies=[Idempotent],
        responses=problems(409, 413, 429),
    )
    router.add_api_route(
        "",
        list_versions,
        methods=["GET"],
        name=f"list_{what}s",
        response_model=Page[out_schema],  # type: ignore[valid-type]
    )
    endpoints: list[tuple[str, Callable[..., VersionOut], str]] = [
        ("/{name}", get_latest, f"get_{what}"),
        ("/{name}/versions/{version}", get_version, f"get_{what}_version"),
    ]
    for path, endpoint, name in endpoints:
        router.add_api_route(
            path,
            endpoint,
            methods=["GET"],
            name=name,
            response_model=out_schema,
            responses=problems(404),
        )
    return router
