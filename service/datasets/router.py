from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.concurrency import run_in_threadpool
from pydantic import ValidationError
from sqlalchemy import select
from starlette.datastructures import UploadFile

from service.datasets import service
from service.datasets.records import parse_jsonl, validate_records
from service.datasets.schemas import DatasetCreate, DatasetOut
from service.deps import SessionDep, SettingsDep, StorageDep, TenantDep
from service.idempotency import Idempotent, IdempotentRoute
from service.models import Dataset
from service.openapi import problems
from service.pagination import Page, PageDep, paginate
from service.problems import FieldError, invalid, json_path
from service.text import unstorable_text

router = APIRouter(
    prefix="/v1/datasets",
    tags=["datasets"],
    route_class=IdempotentRoute,
    responses=problems(400, 401, 422, 500),
)

_UPLOAD_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": DatasetCreate.model_json_schema()},
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["name", "file"],
                    "properties": {
                        "name": {"type": "string"},
                        "file": {"type": "string", "format": "binary", "description": "JSONL"},
                    },
                }
            },
        },
    }
}


async def _read_upload(
    request: Request, max_records: int, max_line_bytes: int
) -> tuple[str, list[dict[str, Any]]]:
    """Name and records from either a JSON body or a multipart JSONL upload."""
    content_type = request.headers.get("content-type", "")
    if content_type.startswith("multipart/form-data"):
        form = await request.form()
        name, upload = form.get("name"), form.get("file")
        errors: list[FieldError] = []
        if not isinstance(name, str) or not 1 <= len(name) <= 200:
            errors.append(FieldError(path="$.name", message="a string of 1 to 200 characters"))
        if not isinstance(upload, UploadFile):
            errors.append(FieldError(path="$.file", message="a JSONL file is required"))
        if errors:
            raise invalid(errors)
        data = await upload.read()
        records, errors = parse_jsonl(data, max_records, max_line_bytes)
        if not errors and (error := unstorable_text(records, "$.file")) is not None:
            errors = [error]
        if errors:
            raise invalid(errors)
        return str(name), records
    try:
        body = DatasetCreate.model_validate(await request.json())  # parsed once, cached
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, pydantic's error
        if isinstance(exc, ValidationError):
            raise invalid(
                [FieldError(path=json_path(e["loc"]), message=e["msg"]) for e in exc.errors()]
            ) from exc
        raise invalid([FieldError(path="$", message=f"invalid JSON: {exc}")]) from exc
    if len(body.records) > max_records:
        raise invalid([FieldError(path="$.records", message=f"more than {max_records} records")])
    errors = validate_records(body.records)
    if errors:
        raise invalid(errors)
    return body.name, body.records


@router.post(
    "",
    status_code=201,
    response_model=DatasetOut,
    openapi_extra=_UPLOAD_BODY,
    dependencies=[Idempotent],
    responses=problems(409, 413),
)
async def create_dataset(
    request: Request,
    session: SessionDep,
    tenant: TenantDep,
    storage: StorageDep,
    settings: SettingsDep,
) -> DatasetOut:
    name, records = await _read_upload(
        request, settings.max_dataset_records, settings.max_dataset_line_bytes
    )
    row = await run_in_threadpool(
        service.create_dataset,
        session,
        storage,
        tenant,
        name,
        records,
        settings.max_dataset_records,
    )
    return DatasetOut.model_validate(row, from_attributes=True)


@router.get("", response_model=Page[DatasetOut])
def list_datasets(session: SessionDep, tenant: TenantDep, page: PageDep) -> Page[DatasetOut]:
    stmt = select(Dataset).where(Dataset.tenant_id == tenant, Dataset.deleted_at.is_(None))
    rows, has_more, nxt = paginate(session, stmt, Dataset.id, page)
    data = [DatasetOut.model_validate(r, from_attributes=True) for r in rows]
    return Page[DatasetOut](data=data, has_more=has_more, next=nxt)


@router.get("/{dataset_id}", response_model=DatasetOut, responses=problems(404))
def get_dataset(dataset_id: str, session: SessionDep, tenant: TenantDep) -> DatasetOut:
    row = service.get_dataset(session, tenant, dataset_id)
    return DatasetOut.model_validate(row, from_attributes=True)


@router.delete("/{dataset_id}", status_code=204, responses=problems(404, 409))
def delete_dataset(dataset_id: str, session: SessionDep, tenant: TenantDep) -> Response:
    service.delete_dataset(session, tenant, dataset_id)
    return Response(status_code=204)
