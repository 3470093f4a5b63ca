"""The Tinker-compatible API under /api/v1 (docs/tinker.md): the routes the official `tinker`
SDK (0.38.0) calls, as it calls them. The SDK sends its key as `X-API-Key: tml-<key>`; the key
behind the prefix is one of ours, checked as every /v1 route checks its bearer key. Training and
sampling requests become futures in the database that a tinker worker executes; the rest is
answered here. A route of the SDK that this server does not implement answers 501."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse

from service.core.problems import ProblemError
from service.http.content_disposition import attachment
from service.http.deps import SessionDep, SettingsDep, StorageDep, authenticate
from service.jobs.checkpoint_use import lineage_in_use
from service.settings import Settings
from service.tinker import caps, checkpoints, futures, history, polling, schemas, service, wire
from service.tinker.service import bad_request

# Out of our OpenAPI document: the contract is the SDK's (docs/tinker.md), and the document
# (its fuzzing, the generated grpo-client models) describes our own /v1 API.
router = APIRouter(prefix="/api/v1", tags=["tinker"], include_in_schema=False)
PROTOBUF = "application/x-protobuf"
KEY_PREFIX = "tml-"
# The SDK's defaults that this server changes (tinker.types.ClientConfigResponse): plain httpx,
# a forward_backward's chunks one after another (a run's requests in order), no pause on a 402
# (a budget does not refill while the client waits), no server-side custom losses; and the
# forward_backward chunks within the request caps (caps.sdk_chunking).
CLIENT_CONFIG = {
    "use_pyqwest_transport": False,
    "parallel_fwdbwd_chunks": False,
    "proto_compress_fwdbwd": False,
    "billing_exception_max_pause_duration_sec": 0,
    "sample_use_retrieve_futures": False,
    "custom_loss_server_side": False,
    "sample_join_sampling_session": False,
    "pjwt_auth_enabled": False,
}


async def tinker_tenant(
    request: Request,
    x_api_key: Annotated[str | None, Header()] = None,
    authorization: Annotated[str | None, Header()] = None,
) -> str:
    """The tenant behind `X-API-Key: tml-<our key>` (or a bare key of ours), or behind
    `Authorization: Bearer <key>` as on /v1 (the dashboard's Tinker page sends that)."""
    if not x_api_key and authorization and authorization.lower().startswith("bearer "):
        x_api_key = authorization[7:].strip()
    if not x_api_key:
        raise ProblemError(401, "Unauthorized", "missing API key (X-API-Key: tml-<key>)")
    return await authenticate(request, x_api_key.removeprefix(KEY_PREFIX))


TenantDep = Annotated[str, Depends(tinker_tenant)]


def _future(row: Any, model_id: str | None = None) -> schemas.UntypedFuture:
    return schemas.UntypedFuture(request_id=row.id, model_id=model_id or row.run_id)


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.post("/client/config")
async def client_config(
    body: schemas.ClientConfigIn, tenant: TenantDep, settings: SettingsDep
) -> dict[str, Any]:
    return CLIENT_CONFIG | caps.sdk_chunking(settings)


@router.post("/client/dynamic_config")
async def dynamic_config(body: schemas.ClientConfigIn, tenant: TenantDep) -> dict[str, Any]:
    return {"refresh_interval_sec": 300, "sample_cancel_enabled": False}


@router.post("/telemetry")
async def telemetry(tenant: TenantDep) -> dict[str, str]:
    """Accepted and dropped: the SDK reports its own events; we keep none."""
    return {"status": "accepted"}


@router.post("/create_session")
def create_session(
    body: schemas.CreateSessionIn, tenant: TenantDep, db: SessionDep, settings: SettingsDep
) -> dict[str, Any]:
    return {"type": "create_session", "session_id": service.create_session(db, settings, tenant)}


@router.post("/session_heartbeat")
def session_heartbeat(body: schemas.SessionIdIn, tenant: TenantDep, db: SessionDep) -> dict:
    service.heartbeat(db, tenant, body.session_id)
    return {"type": "session_heartbeat"}


@router.post("/sessions/{session_id}/finish")
def finish_session(session_id: str, tenant: TenantDep, db: SessionDep) -> dict[str, Any]:
    service.finish_session(db, tenant, session_id)
    return {}


@router.get("/get_server_capabilities")
def capabilities(tenant: TenantDep, db: SessionDep) -> schemas.Capabilities:
    return service.capabilities(db)


@router.post("/create_model")
def create_model(
    body: schemas.CreateModelIn, tenant: TenantDep, db: SessionDep
) -> schemas.UntypedFuture:
    run = service.create_run(db, tenant, body)
    done = {"type": "create_model", "model_id": run.id}
    row = futures.submit(db, tenant, "create_model", run.base_model, {}, run, status="done",
                         result=done)  # fmt: skip
    return _future(row)


@router.post("/get_info")
def get_info(body: schemas.ModelIdIn, tenant: TenantDep, db: SessionDep) -> dict[str, Any]:
    return service.run_info(db, service.get_run(db, tenant, body.model_id))


@router.post("/forward_backward")
async def forward_backward(
    request: Request, tenant: TenantDep, db: SessionDep, settings: SettingsDep
):
    """A protobuf ForwardBackwardRequest (service/tinker/wire.py); `forward_only` makes it the
    SDK's `forward`."""
    if PROTOBUF not in request.headers.get("content-type", ""):
        raise bad_request("content-type", f"the SDK sends {PROTOBUF}")
    if request.headers.get("content-encoding"):
        raise bad_request("content-encoding", "compressed bodies are not accepted")
    try:
        body = wire.decode_forward_backward(await request.body())
    except wire.WireError as exc:
        raise bad_request(exc.field, exc.message) from None
    return await run_in_threadpool(_queue_forward_backward, db, tenant, body, settings)


def _queue_forward_backward(
    db: Any, tenant: str, body: dict[str, Any], settings: Settings
) -> schemas.UntypedFuture:
    run = service.live_run(db, tenant, body["model_id"])
    caps.check_data(body["data"], settings)
    futures.check_forward_backward(body, service.catalog_model(db, run.base_model))
    kind = "forward" if body["forward_only"] else "forward_backward"
    payload = {k: body[k] for k in ("loss_fn", "loss_fn_config", "data")}
    return _future(futures.submit(db, tenant, kind, run.base_model, payload, run))


@router.post("/optim_step")
def optim_step(body: schemas.OptimStepIn, tenant: TenantDep, db: SessionDep):
    run = service.live_run(db, tenant, body.model_id)
    if body.optimizer_params is not None:
        raise bad_request("optimizer_params", "only Adam (adam_params) is supported")
    adam = (body.adam_params or schemas.AdamParamsIn()).model_dump()
    return _future(futures.submit(db, tenant, "optim_step", run.base_model, {"adam": adam}, run))


@router.post("/save_weights")
def save_weights(
    body: schemas.SaveWeightsIn, tenant: TenantDep, db: SessionDep, settings: SettingsDep
):
    run = service.live_run(db, tenant, body.model_id)
    name = service.checkpoint_name("path", body.path, f"step-{body.seq_id or 0}")
    checkpoints.check_ttl(body.ttl_seconds)
    service.check_name_free(db, run, "training", name, body.overwrite)
    checkpoints.refuse_over_cap(db, settings, run, "training", name)
    payload = {"name": name, "user_metadata": body.user_metadata, "ttl_seconds": body.ttl_seconds}
    return _future(futures.submit(db, tenant, "save_weights", run.base_model, payload, run))


@router.post("/save_weights_for_sampler")
def save_for_sampler(
    body: schemas.SaveForSamplerIn, tenant: TenantDep, db: SessionDep, settings: SettingsDep
):
    """With a name: a sampler checkpoint. Without (save_weights_and_get_sampling_client): one
    named after the request, expiring after GRPO_TINKER_EPHEMERAL_TTL_S, and a sampling
    session on it, whose id the future answers."""
    run = service.live_run(db, tenant, body.model_id)
    name = service.checkpoint_name("path", body.path, f"sampler-{body.seq_id or 0}")
    ttl = body.ttl_seconds
    if body.path is None:
        name, ttl = f"ephemeral-{futures.new_checkpoint_id()}", settings.tinker_ephemeral_ttl_s
    checkpoints.check_ttl(ttl)
    taken = service.check_name_free(db, run, "sampler", name, True)
    if taken is not None and lineage_in_use(db, tenant, taken.id):  # keep what a job loads
        path = service.tinker_path(run.id, "sampler", name)
        raise ProblemError(409, "Conflict", f"{path} is the base of a live job (another name)")
    checkpoints.refuse_over_cap(db, settings, run, "sampler", name)
    payload = {"name": name, "user_metadata": body.user_metadata, "ttl_seconds": ttl,
               "sampling_session": body.path is None, "session_id": run.session_id}  # fmt: skip
    return _future(futures.submit(db, tenant, "save_for_sampler", run.base_model, payload, run))


@router.post("/load_weights")
def load_weights(body: schemas.LoadWeightsIn, tenant: TenantDep, db: SessionDep):
    ckpt = service.find_checkpoint(db, tenant, body.path, "training")
    if body.model_id:
        run = service.live_run(db, tenant, body.model_id)
    elif body.session_id:  # create_training_client_from_state: a new run on the state's config
        source = service.get_run(db, tenant, ckpt.run_id)
        create = schemas.CreateModelIn(
            session_id=body.session_id,
            model_seq_id=body.model_seq_id or 0,
            base_model=body.base_model or source.base_model,
            user_metadata=body.user_metadata,
            lora_config=schemas.LoraConfigIn(**source.lora_config),
        )
        run = service.create_run(db, tenant, create)
    else:
        raise bad_request("model_id", "model_id or session_id is required")
    if run.base_model != service.get_run(db, tenant, ckpt.run_id).base_model:
        raise bad_request("path", "the checkpoint is of another base model")
    payload = {"checkpoint_id": ckpt.id, "object_key": ckpt.object_key,
               "optimizer": body.optimizer, "path": body.path}  # fmt: skip
    return _future(futures.submit(db, tenant, "load_weights", run.base_model, payload, run))


@router.post("/create_sampling_session")
def create_sampling_session(
    body: schemas.CreateSamplingSessionIn, tenant: TenantDep, db: SessionDep
) -> dict[str, Any]:
    row = service.create_sampler(db, tenant, body)
    return {"type": "create_sampling_session", "sampling_session_id": row.id}


@router.post("/join_sampling_session")
def join_sampling_session(
    body: schemas.SamplingSessionIdIn, tenant: TenantDep, db: SessionDep
) -> dict[str, Any]:
    counter = service.join_sampler(db, tenant, body.sampling_session_id)
    return {"type": "join_sampling_session", "client_counter": counter}


@router.get("/samplers/{sampler_id}")
def get_sampler(sampler_id: str, tenant: TenantDep, db: SessionDep) -> dict[str, Any]:
    row = service.get_session(db, tenant, sampler_id, "sampler")
    return {"sampler_id": row.id, "base_model": row.base_model, "model_path": row.model_path}


@router.post("/asample")
def asample(body: schemas.SampleIn, tenant: TenantDep, db: SessionDep, settings: SettingsDep):
    if body.topk_prompt_logprobs or body.topk_sample_logprobs or body.prompt_alt_tokens_k:
        raise bad_request("topk_prompt_logprobs", "top-k log-probs are not supported")
    if body.sampling_session_id:
        sampler = service.live_sampler(db, tenant, body.sampling_session_id)
        base, path = sampler.base_model or "", sampler.model_path
    else:
        base, path = body.base_model or "", body.model_path
    weights = None
    if path:
        ckpt = service.find_checkpoint(db, tenant, path, "sampler", "model_path")
        base = service.get_run(db, tenant, ckpt.run_id).base_model
        weights = {"checkpoint_id": ckpt.id, "object_key": ckpt.object_key}
    model = service.catalog_model(db, base)
    prompt: list[int] = []
    for i, chunk in enumerate(body.prompt.chunks):
        if chunk.tokens is None:
            raise bad_request(f"prompt.chunks[{i}]", "only text chunks (encoded_text)")
        prompt.extend(chunk.tokens)
    params = body.sampling_params
    futures.check_sample(prompt, body.num_samples, params, model)
    caps.check_sample(len(prompt), body.num_samples, params.max_tokens or 0, settings)
    stop = [params.stop] if isinstance(params.stop, str) else params.stop
    payload = {
        "prompt": prompt,
        "num_samples": body.num_samples,
        "params": params.model_dump() | {"stop": stop},
        "prompt_logprobs": bool(body.prompt_logprobs),
        "weights": weights,
    }
    row = futures.submit(db, tenant, "sample", model.name, payload)
    ids = [f"{row.id}:{i}" for i in range(body.num_samples)]
    return schemas.UntypedFuture(request_id=row.id, sample_sequence_ids=ids)


@router.post("/retrieve_future")
async def retrieve_future(
    body: schemas.RetrieveFutureIn, request: Request, tenant: TenantDep
) -> Response:
    """Long-poll: the result once the request is done, else `try_again` with its place in the
    queue after GRPO_TINKER_LONG_POLL_S (the SDK asks again at once)."""
    found = await polling.wait(tenant, body.request_id)
    return polling.answer(found, PROTOBUF in request.headers.get("accept", ""))


@router.get("/training_runs")
def training_runs(
    tenant: TenantDep,
    db: SessionDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 20,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> schemas.TrainingRunsList:
    return service.list_runs(db, tenant, limit, offset)


@router.get("/training_runs/{run_id}")
def training_run(run_id: str, tenant: TenantDep, db: SessionDep) -> schemas.TrainingRunOut:
    return service.run_out(db, service.get_run(db, tenant, run_id))


@router.get("/training_runs/{run_id}/checkpoints")
def run_checkpoints(run_id: str, tenant: TenantDep, db: SessionDep) -> schemas.CheckpointsList:
    return service.list_checkpoints(db, service.get_run(db, tenant, run_id))


@router.get("/training_runs/{run_id}/loss")
def run_loss(run_id: str, tenant: TenantDep, db: SessionDep) -> dict[str, Any]:
    """Ours, for the dashboard: the loss of each forward pass of the run (`history.py`)."""
    return {"data": history.loss_history(db, service.get_run(db, tenant, run_id))}


@router.get("/training_runs/{run_id}/checkpoints/{kind}/{name}/archive")
def checkpoint_archive(
    run_id: str, kind: str, name: str, tenant: TenantDep, db: SessionDep, storage: StorageDep
) -> StreamingResponse:
    """The checkpoint's files as one tar (ours; the SDK's download exports through routes we do
    not serve). A sampler checkpoint unpacks to a peft adapter directory."""
    path = f"tinker://{run_id}/{kind}/{name}"
    ckpt = service.find_checkpoint(db, tenant, path)
    headers = {"Content-Disposition": attachment(f"{ckpt.name}.tar"),
               "Content-Length": str(storage.size(ckpt.object_key))}  # fmt: skip
    return StreamingResponse(
        storage.open_stream(ckpt.object_key), media_type="application/x-tar", headers=headers
    )


@router.delete("/training_runs/{run_id}/checkpoints/{kind}/{name}", status_code=204)
def delete_checkpoint(
    run_id: str, kind: str, name: str, tenant: TenantDep, db: SessionDep, storage: StorageDep
) -> Response:
    """The SDK's delete_checkpoint: the row now, its object once that has committed."""
    ckpt = service.find_checkpoint(db, tenant, f"tinker://{run_id}/{kind}/{name}")
    checkpoints.delete_checkpoint(db, storage, ckpt)
    return Response(status_code=204)


@router.api_route(
    "/training_runs/{run_id}/checkpoints/{kind}/{name}/ttl", methods=["PUT", "POST"],
    status_code=204,
)  # fmt: skip
def checkpoint_ttl(
    run_id: str, kind: str, name: str, body: schemas.CheckpointTtlIn, tenant: TenantDep,
    db: SessionDep,
) -> Response:  # fmt: skip
    """The SDK's set_checkpoint_ttl: expires `ttl_seconds` from now; null: never."""
    ckpt = service.find_checkpoint(db, tenant, f"tinker://{run_id}/{kind}/{name}")
    checkpoints.set_ttl(db, ckpt, body.ttl_seconds)
    return Response(status_code=204)


@router.post("/weights_info")
def weights_info(body: schemas.WeightsInfoIn, tenant: TenantDep, db: SessionDep) -> dict:
    ckpt = service.find_checkpoint(db, tenant, body.tinker_path, field="tinker_path")
    run = service.get_run(db, tenant, ckpt.run_id)
    config = run.lora_config
    return {"base_model": run.base_model, "is_lora": True, "lora_rank": run.lora_rank,
            **{k: config.get(k) for k in ("train_unembed", "train_mlp", "train_attn")}}  # fmt: skip


# Routes of the SDK this server does not serve: a clear 501, never a 500 or a bare 404.
UNSUPPORTED = {
    ("POST", "/create_custom_loss"): "server-side custom losses",
    ("POST", "/retrieve_futures"): "retrieve_futures (the SDK's sample_use_retrieve_futures)",
    ("POST", "/cancel_future"): "cancelling a future",
    ("POST", "/copy_weights"): "copy_weights",
    ("POST", "/save_weights_external"): "external weights (use .../archive, docs/tinker.md)",
    ("GET", "/training_runs/{run_id}/checkpoints/{kind}/{name}/external_weights_urls"):
        "external weights URLs (use .../archive, docs/tinker.md)",
    ("POST", "/training_runs/{run_id}/checkpoints/{kind}/{name}/publish"): "publishing",
    ("DELETE", "/training_runs/{run_id}/checkpoints/{kind}/{name}/publish"): "publishing",
    ("GET", "/checkpoints"): "listing every checkpoint of a user",
    ("GET", "/sessions"): "listing sessions",
    ("GET", "/sessions/{session_id}"): "session details",
    ("POST", "/sessions/search"): "session search",
    ("POST", "/sessions/{session_id}/project"): "projects",
    ("POST", "/sessions/{session_id}/trace_export"): "trace export",
    ("POST", "/auth/token"): "JWT exchange",
    ("GET", "/auth/apikey/me"): "whoami (use GET /v1/whoami)",
    ("GET", "/audit"): "the audit log",
    ("GET", "/billing/usage/events"): "billing (use GET /v1/usage)",
    ("GET", "/billing/usage/checkpoints/current"): "billing (use GET /v1/usage)",
}  # fmt: skip


def _unsupported(what: str) -> Any:
    async def not_implemented(tenant: TenantDep) -> None:
        raise service.no_such_route(what)

    return not_implemented


for (_method, _path), _what in UNSUPPORTED.items():
    router.add_api_route(_path, _unsupported(_what), methods=[_method])
