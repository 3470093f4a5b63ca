"""The protobuf half of the Tinker wire format (SDK 0.38.0): `POST /api/v1/forward_backward`
sends a `ForwardBackwardRequest` message, and `retrieve_future` must answer a forward/backward
or a sample with a `ForwardBackwardOutput` / `SampleResponse` message when the SDK asks
(`Accept: application/x-protobuf`; it refuses JSON for those two).

The messages are declared here, field numbers as the SDK's `tinker_public.proto`, and only the
fields we read or write: protobuf skips unknown fields, so the rest of the SDK's message (image
chunks, provenance spans, top-k log-probs) parses and is ignored or refused by the caller. Built
with protobuf's own descriptor API: no generated file, no protoc, no SDK import on the server.
"""

from __future__ import annotations

import math
import struct
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_F = descriptor_pb2.FieldDescriptorProto
_OPT, _REP = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED
_PKG = "grpo_tinker_wire"

DTYPE_FLOAT32, DTYPE_INT64, DTYPE_INT32 = 1, 2, 3
STOP_REASON = {"stop": 0, "length": 1}

# (name, [(field name, number, type, label, message type or None, oneof index or None)],
#  oneofs, map entry)
_MESSAGES: list[tuple[str, list[tuple[str, int, int, int, str | None, int | None]], list[str]]] = [
    ("SparseCsr", [("values", 1, _F.TYPE_BYTES, _OPT, None, None),
                   ("crow_indices", 2, _F.TYPE_BYTES, _OPT, None, None),
                   ("col_indices", 3, _F.TYPE_BYTES, _OPT, None, None)], []),
    ("Tensor", [("dense", 1, _F.TYPE_BYTES, _OPT, None, 0),
                ("sparse_csr", 2, _F.TYPE_MESSAGE, _OPT, "SparseCsr", 0),
                ("dtype", 3, _F.TYPE_INT32, _OPT, None, None),
                ("shape", 4, _F.TYPE_INT64, _REP, None, None)], ["encoding"]),
    ("EncodedTextChunk", [("tokens", 1, _F.TYPE_BYTES, _OPT, None, None)], []),
    ("Opaque", [], []),  # an image or audio chunk: present, never read
    ("Chunk", [("encoded_text", 1, _F.TYPE_MESSAGE, _OPT, "EncodedTextChunk", 0),
               ("image", 2, _F.TYPE_MESSAGE, _OPT, "Opaque", 0),
               ("dmel", 3, _F.TYPE_MESSAGE, _OPT, "Opaque", 0)], ["chunk"]),
    ("Datum", [("model_input", 1, _F.TYPE_MESSAGE, _REP, "Chunk", None),
               ("loss_fn_inputs", 2, _F.TYPE_MESSAGE, _REP, "Datum.LossFnInputsEntry", None)], []),
    ("LossConfigValue", [("number", 1, _F.TYPE_DOUBLE, _OPT, None, 0),
                         ("text", 2, _F.TYPE_STRING, _OPT, None, 0)], ["value"]),
    ("ForwardBackwardRequest", [
        ("model_id", 1, _F.TYPE_STRING, _OPT, None, None),
        ("seq_id", 2, _F.TYPE_INT32, _OPT, None, None),
        ("data", 3, _F.TYPE_MESSAGE, _REP, "Datum", None),
        ("loss_fn", 4, _F.TYPE_STRING, _OPT, None, None),
        ("loss_fn_config", 5, _F.TYPE_MESSAGE, _REP, "ForwardBackwardRequest.LossFnConfigEntry",
         None),
        ("forward_only", 6, _F.TYPE_BOOL, _OPT, None, None),
        ("loss_fn_config_v2", 7, _F.TYPE_MESSAGE, _REP,
         "ForwardBackwardRequest.LossFnConfigV2Entry", None)], []),
    ("BatchedTensor", [("data", 1, _F.TYPE_BYTES, _OPT, None, None),
                       ("offsets", 2, _F.TYPE_BYTES, _OPT, None, None),
                       ("dtype", 3, _F.TYPE_INT32, _OPT, None, None),
                       ("trailing_shape", 4, _F.TYPE_INT64, _REP, None, None)], []),
    ("ArrayRecord", [("type_tag", 1, _F.TYPE_STRING, _OPT, None, None),
                     ("fields", 2, _F.TYPE_MESSAGE, _REP, "ArrayRecord.FieldsEntry", None),
                     ("num_datums", 3, _F.TYPE_INT64, _OPT, None, None)], []),
    ("ForwardBackwardOutput", [
        ("loss_fn_output_type", 1, _F.TYPE_STRING, _OPT, None, None),
        ("loss_fn_outputs", 2, _F.TYPE_MESSAGE, _REP, "ArrayRecord", None),
        ("metrics", 3, _F.TYPE_MESSAGE, _REP, "ForwardBackwardOutput.MetricsEntry", None)], []),
    ("SampledSequence", [("stop_reason", 1, _F.TYPE_INT32, _OPT, None, None),
                         ("tokens", 2, _F.TYPE_BYTES, _OPT, None, None),
                         ("logprobs", 3, _F.TYPE_BYTES, _OPT, None, None)], []),
    ("SampleResponse", [("sequences", 1, _F.TYPE_MESSAGE, _REP, "SampledSequence", None),
                        ("prompt_logprobs", 2, _F.TYPE_BYTES, _OPT, None, None)], []),
]  # fmt: skip
# Map fields: (message, entry name, value type, value message)
_MAPS = [
    ("Datum", "LossFnInputsEntry", _F.TYPE_MESSAGE, "Tensor"),
    ("ForwardBackwardRequest", "LossFnConfigEntry", _F.TYPE_DOUBLE, None),
    ("ForwardBackwardRequest", "LossFnConfigV2Entry", _F.TYPE_MESSAGE, "LossConfigValue"),
    ("ArrayRecord", "FieldsEntry", _F.TYPE_MESSAGE, "BatchedTensor"),
    ("ForwardBackwardOutput", "MetricsEntry", _F.TYPE_DOUBLE, None),
]


def _file() -> descriptor_pb2.FileDescriptorProto:
    fd = descriptor_pb2.FileDescriptorProto(name="grpo_tinker_wire.proto", package=_PKG)
    fd.syntax = "proto3"
    by_name: dict[str, descriptor_pb2.DescriptorProto] = {}
    for name, fields, oneofs in _MESSAGES:
        msg = fd.message_type.add(name=name)
        by_name[name] = msg
        for oneof in oneofs:
            msg.oneof_decl.add(name=oneof)
        for fname, number, ftype, label, type_name, oneof_index in fields:
            field = msg.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                field.type_name = f".{_PKG}.{type_name}"
            if oneof_index is not None:
                field.oneof_index = oneof_index
    for owner, entry, vtype, vmsg in _MAPS:
        nested = by_name[owner].nested_type.add(name=entry)
        nested.options.map_entry = True
        nested.field.add(name="key", number=1, type=_F.TYPE_STRING, label=_OPT)
        value = nested.field.add(name="value", number=2, type=vtype, label=_OPT)
        if vmsg:
            value.type_name = f".{_PKG}.{vmsg}"
    return fd


_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_file())


def _cls(name: str) -> Any:
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"{_PKG}.{name}"))


ForwardBackwardRequestPb = _cls("ForwardBackwardRequest")
ForwardBackwardOutputPb = _cls("ForwardBackwardOutput")
SampleResponsePb = _cls("SampleResponse")

_NUMERIC = {DTYPE_FLOAT32: ("f", 4), DTYPE_INT64: ("q", 8), DTYPE_INT32: ("i", 4)}


class WireError(ValueError):
    """A message that parses but that we cannot use; `field` is its JSON-path-like name."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message


def _numbers(raw: bytes, dtype: int, field: str) -> list[float] | list[int]:
    fmt = _NUMERIC.get(dtype)
    if fmt is None:
        raise WireError(field, f"unsupported dtype {dtype} (float32 or int64)")
    code, size = fmt
    if len(raw) % size:
        raise WireError(field, "tensor bytes are not a whole number of elements")
    return list(struct.unpack(f"<{len(raw) // size}{code}", raw))


def _tensor(msg: Any, field: str) -> list[float] | list[int]:
    if msg.WhichOneof("encoding") == "sparse_csr":
        raise WireError(field, "sparse tensors are not supported")
    values = _numbers(msg.dense, msg.dtype, field)
    expected = math.prod(msg.shape) if len(msg.shape) else len(values)
    if expected != len(values):
        raise WireError(field, f"shape {list(msg.shape)} does not match {len(values)} values")
    return values


def decode_forward_backward(body: bytes) -> dict[str, Any]:
    """The request as the JSON routes see theirs: model_id, seq_id, loss_fn, loss_fn_config,
    forward_only, and data as [{"tokens": [...], "loss_fn_inputs": {name: [numbers]}}]."""
    msg = ForwardBackwardRequestPb()
    try:
        msg.ParseFromString(body)
    except Exception as exc:  # protobuf's DecodeError, or a message too deep
        raise WireError("$", f"not a ForwardBackwardRequest message ({exc})") from None
    config: dict[str, float | str] = dict(msg.loss_fn_config.items())
    for key, value in msg.loss_fn_config_v2.items():  # preferred where both are set
        config[key] = value.text if value.WhichOneof("value") == "text" else value.number
    data = []
    for i, datum in enumerate(msg.data):
        tokens: list[int] = []
        for j, chunk in enumerate(datum.model_input):
            if chunk.WhichOneof("chunk") != "encoded_text":
                raise WireError(f"data[{i}].model_input.chunks[{j}]", "only text chunks")
            tokens.extend(_numbers(chunk.encoded_text.tokens, DTYPE_INT32, "tokens"))  # type: ignore[arg-type]
        inputs = {
            name: _tensor(t, f"data[{i}].loss_fn_inputs.{name}")
            for name, t in datum.loss_fn_inputs.items()
        }
        data.append({"tokens": tokens, "loss_fn_inputs": inputs})
    return {
        "model_id": msg.model_id,
        "seq_id": msg.seq_id,
        "loss_fn": msg.loss_fn,
        "loss_fn_config": config or None,
        "forward_only": msg.forward_only,
        "data": data,
    }


def encode_forward_backward_output(result: dict[str, Any]) -> bytes:
    """{"loss_fn_outputs": [{name: [floats]} per datum], "metrics": {name: float}} as the SDK
    reads it: one ArrayRecord, each output a float32 BatchedTensor sliced per datum by byte
    offsets."""
    outputs: list[dict[str, list[float]]] = result.get("loss_fn_outputs") or []
    msg = ForwardBackwardOutputPb(loss_fn_output_type="ArrayRecord")
    for key, value in (result.get("metrics") or {}).items():
        msg.metrics[key] = float(value)
    record = msg.loss_fn_outputs.add(type_tag="ArrayRecord", num_datums=len(outputs))
    names = sorted({name for datum in outputs for name in datum})
    for name in names:
        rows = [[float(x) for x in datum.get(name, [])] for datum in outputs]
        offsets = [0]
        for row in rows:
            offsets.append(offsets[-1] + 4 * len(row))
        flat = [x for row in rows for x in row]
        batched = record.fields[name]
        batched.data = struct.pack(f"<{len(flat)}f", *flat)
        batched.offsets = struct.pack(f"<{len(offsets)}q", *offsets)
        batched.dtype = DTYPE_FLOAT32
    return msg.SerializeToString()


def encode_sample_response(result: dict[str, Any]) -> bytes:
    """{"sequences": [{"tokens", "logprobs", "stop_reason"}], "prompt_logprobs": [float|None]}:
    tokens int32, log-probs float32, a prompt position without one NaN (the SDK's convention)."""
    msg = SampleResponsePb()
    for seq in result.get("sequences") or []:
        out = msg.sequences.add(stop_reason=STOP_REASON.get(seq.get("stop_reason"), 1))
        tokens = [int(t) for t in seq.get("tokens") or []]
        out.tokens = struct.pack(f"<{len(tokens)}i", *tokens)
        if seq.get("logprobs") is not None:
            out.logprobs = struct.pack(f"<{len(seq['logprobs'])}f", *seq["logprobs"])
    prompt = result.get("prompt_logprobs")
    if prompt is not None:
        values = [math.nan if v is None else float(v) for v in prompt]
        msg.prompt_logprobs = struct.pack(f"<{len(values)}f", *values)
    return msg.SerializeToString()
