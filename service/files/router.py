"""OpenAI's `/v1/files` (the official `openai` SDK's `files`), `purpose: "fine-tune"`: JSONL in
OpenAI's reinforcement fine-tuning format, validated line by line, stored as one of our
datasets (`service.files.lines`)."""

from __future__ import annotations

from pathlib import PurePosixPath, PureWindowsPath
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from service.core.pagination import PageDep
from service.core.problems import FieldError, ProblemError
from service.core.text import unstorable_value
from service.datasets.builder import from_jsonl
from service.files import lines, service
from service.files.schemas import PURPOSE, FileDeleted, FileList, FileOut
from service.http.deps import SessionDep, SettingsDep, StorageDep, TenantDep
from service.http.idempotency import Idempotent, IdempotentRoute
from service.http.json_body import reads_its_body
from service.http.openapi import problems

router = APIRouter(
    prefix="/v1/files",
    tags=["files"],
    route_class=IdempotentRoute,
    responses=problems(400, 401, 422, 500),
)

_UPLOAD_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file", "purpose"],
                    "properties": {
                        "file": {
                            "type": "string",
                            "format": "binary",
                            "description": "JSONL, one `{messages, ...fields}` per line.",
                        },
                        "purpose": {"type": "string", "enum": [PURPOSE]},
                    },
                }
            }
        },
    }
}


def bad_request(errors: list[FieldError]) -> ProblemError:
    """OpenAI answers a bad upload 400 (`openai.BadRequestError`); every bad field listed."""
    detail = "; ".join(f"{e.path}: {e.message}" for e in errors)
    return ProblemError(400, "Bad Request", detail, errors=errors)


def _filename(upload: UploadFile) -> str | None:
    raw = upload.filename or ""
    name = PureWindowsPath(PurePosixPath(raw).name).name  # a client's path: its last part
    return name if 1 <= len(name) <= 200 and unstorable_value(name) is None else None


@router.post(
    "",
    status_code=201,
    response_model=FileOut,
    openapi_extra=_UPLOAD_BODY,
    dependencies=[Idempotent],
    responses=problems(409, 413),
)
@reads_its_body
async def upload_file(
    request: Request,
    session: SessionDep,
    tenant: TenantDep,
    storage: StorageDep,
    settings: SettingsDep,
) -> FileOut:
    """Upload a JSONL training or validation file. Every line is validated; a bad one is named
    by its number (400). The file is one of your datasets too (`dataset`)."""
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise bad_request([FieldError(path="$", message="a multipart/form-data upload")])
    form = await request.form()
    upload, purpose = form.get("file"), form.get("purpose")
    errors = []
    if purpose != PURPOSE:
        message = f"only purpose '{PURPOSE}' is stored here (reinforcement fine-tuning data)"
        errors.append(FieldError(path="$.purpose", message=message))
    filename = _filename(upload) if isinstance(upload, UploadFile) else None
    if filename is None:
        message = "a JSONL file with a file name of 1 to 200 characters is required"
        errors.append(FieldError(path="$.file", message=message))
    if errors or not isinstance(upload, UploadFile) or filename is None:
        raise bad_request(errors)
    data = await upload.read()
    built = await run_in_threadpool(
        from_jsonl,
        data,
        settings.max_dataset_records,
        settings.max_dataset_line_bytes,
        lines.from_line,
    )
    if built.errors:
        raise bad_request(built.errors)
    row = await run_in_threadpool(
        service.create_file, session, storage, settings, tenant, filename, PURPOSE, built
    )
    return FileOut.of(row)


@router.get("", response_model=FileList)
def list_files(
    session: SessionDep,
    tenant: TenantDep,
    page: PageDep,
    purpose: Annotated[Literal["fine-tune"] | None, Query(description="Only this purpose.")] = None,
    order: Annotated[Literal["desc"], Query(description="Newest first (only).")] = "desc",
) -> FileList:
    rows, has_more, nxt = service.list_files(session, tenant, page, purpose)
    data = [FileOut.of(r) for r in rows]
    first, last = (data[0].id, data[-1].id) if data else (None, None)
    return FileList(data=data, has_more=has_more, first_id=first, last_id=last, next=nxt)


@router.get("/{file_id}", response_model=FileOut, responses=problems(404))
def get_file(file_id: str, session: SessionDep, tenant: TenantDep) -> FileOut:
    return FileOut.of(service.get_file(session, tenant, file_id))


@router.delete("/{file_id}", response_model=FileDeleted, responses=problems(404, 409))
def delete_file(file_id: str, session: SessionDep, tenant: TenantDep) -> FileDeleted:
    """Delete the file (its dataset too: they are one). 409 while a live job trains on it."""
    return FileDeleted(id=service.delete_file(session, tenant, file_id))


@router.get(
    "/{file_id}/content",
    response_class=Response,
    responses={
        200: {
            "description": "The file's JSONL, one `{messages, ...fields}` per line.",
            "content": {"application/jsonl": {"schema": {"type": "string"}}},
        },
        **problems(404),
    },
)
def file_content(
    file_id: str, session: SessionDep, tenant: TenantDep, storage: StorageDep
) -> Response:
    row = service.get_file(session, tenant, file_id)
    return Response(service.file_content(storage, row), media_type="application/jsonl")
