from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.concurrency import run_in_threadpool
from sqlalchemy import select
from starlette.datastructures import UploadFile

from service.core.pagination import Page, PageDep, paginate
from service.core.problems import FieldError, invalid
from service.datasets import service
from service.datasets.builder import BuiltDataset, from_json_body, from_jsonl
from service.datasets.schemas import DatasetCreate, DatasetOut, DatasetRecordOut
from service.http.content_disposition import attachment
from service.http.deps import SessionDep, SettingsDep, StorageDep, TenantDep
from service.http.idempotency import Idempotent, IdempotentRoute
from service.http.json_body import reads_its_body
from service.http.openapi import problems
from service.models import Dataset
from service.settings import Settings

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


async def _read_upload(request: Request, settings: Settings) -> tuple[str, BuiltDataset]:
    """Name and canonical records from a JSON body or a multipart JSONL upload, parsed off
    the event loop a record at a time (`builder`)."""
    content_type = request.headers.get("content-type", "")
    if content_type.startswith("multipart/form-data"):
        form = await request.form()
        name, upload = form.get("name"), form.get("file")
        errors: list[FieldError] = []
        if not isinstance(name, str) or not 1 <= len(name) <= 200:
            errors.append(FieldError(path="$.name", message="a string of 1 to 200 characters"))
        if not isinstance(upload, UploadFile):
            errors.append(FieldError(path="$.file", message="a JSONL file is required"))
        if errors or not isinstance(upload, UploadFile):
            raise invalid(errors)
        data = await upload.read()
        built = await run_in_threadpool(
            from_jsonl, data, settings.max_dataset_records, settings.max_dataset_line_bytes
        )
    else:
        data = await request.body()
        name, built = await run_in_threadpool(from_json_body, data, settings.max_dataset_records)
    if built.errors:
        raise invalid(built.errors)
    return str(name), built


@router.post(
    "",
    status_code=201,
    response_model=DatasetOut,
    openapi_extra=_UPLOAD_BODY,
    dependencies=[Idempotent],
    responses=problems(409, 413),
)
@reads_its_body
async def create_dataset(
    request: Request,
    session: SessionDep,
    tenant: TenantDep,
    storage: StorageDep,
    settings: SettingsDep,
) -> DatasetOut:
    name, built = await _read_upload(request, settings)
    row = await run_in_threadpool(
        service.create_dataset, session, storage, settings, tenant, name, built
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


@router.get("/{dataset_id}/records", response_model=Page[DatasetRecordOut], responses=problems(404))
def list_records(
    dataset_id: str, session: SessionDep, tenant: TenantDep, storage: StorageDep, page: PageDep
) -> Page[DatasetRecordOut]:
    """The dataset's records in file order (not newest first): `after` is the id (position) of
    the last record of the previous page."""
    row = service.get_dataset(session, tenant, dataset_id)
    records, has_more = service.page_records(storage, row, page.limit, page.after)
    data = [DatasetRecordOut(id=str(i), index=i, record=r) for i, r in records]
    return Page[DatasetRecordOut](
        data=data, has_more=has_more, next=data[-1].id if has_more else None
    )


@router.get(
    "/{dataset_id}/download",
    response_class=Response,
    responses={
        200: {"content": {"application/jsonl": {"schema": {"type": "string"}}},
              "description": "The stored records, canonical JSONL."},
        **problems(404),
    },
)  # fmt: skip
def download_dataset(
    dataset_id: str, session: SessionDep, tenant: TenantDep, storage: StorageDep
) -> Response:
    """The dataset's records as stored: one JSON object a line."""
    row = service.get_dataset(session, tenant, dataset_id)
    return Response(
        storage.get_bytes(row.object_key),
        media_type="application/jsonl",
        headers={"Content-Disposition": attachment(f"{row.id}.jsonl")},
    )


@router.delete("/{dataset_id}", status_code=204, responses=problems(404, 409))
def delete_dataset(dataset_id: str, session: SessionDep, tenant: TenantDep) -> Response:
    service.delete_dataset(session, tenant, dataset_id)
    return Response(status_code=204)
