"""Resume payloads validated once, at resolve time, with the tool's own models."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import jsonschema
import orjson
from pydantic import BaseModel, ValidationError

from runtime.agent import Agent
from runtime.domain import ToolCallPart, WaitKind
from runtime.errors import InvalidPayload
from runtime.tools import ResultPayload

_MAX_FIELD_ERRORS = 20
_MAX_ERROR_CHARS = 200
_MESSAGE = "the payload does not match the action's schema"


def check_payload(agent: Agent, part: ToolCallPart, payload: Mapping[str, Any]) -> None:
    """Raise InvalidPayload (with field errors) unless `payload` resolves `part`'s action.

    The model is the one the runtime later builds the tool's typed payload with: the tool's
    SuspendStep payload for approvals, ResultPayload for client and manual results, whose
    `output` must then match the tool's declared output model. A validator of the tool's own
    model therefore refuses here, before anything changed, never after the run resumed. Only a
    tool the agent no longer has falls back to the JSON Schema stored with the action."""
    waiting = part.waiting
    if waiting is None:
        return
    tool_ = agent.tool(part.name)
    if waiting.kind is WaitKind.APPROVAL:
        if tool_ is None or tool_.suspend is None:
            _check_schema(waiting.payload_schema, payload)
            return
        _check_model(tool_.suspend.payload, payload)
        return
    submitted = _check_model(ResultPayload, payload)
    assert isinstance(submitted, ResultPayload)
    if submitted.error is None and tool_ is not None and tool_.output_model is not None:
        _check_model(tool_.output_model, submitted.output, prefix=("output",))


def _check_model(model: type[BaseModel], value: Any, prefix: tuple[str, ...] = ()) -> BaseModel:
    # Strict JSON validation: the payload arrived as JSON and its public contract is the
    # model's JSON Schema, so "yes" is no boolean and "1" no integer (lax mode would coerce).
    try:
        raw = orjson.dumps(value)
    except (TypeError, orjson.JSONEncodeError) as exc:  # nested past the encoder's limit
        raise InvalidPayload(_MESSAGE, errors=[{"loc": list(prefix), "msg": str(exc)}]) from exc
    try:
        return model.model_validate_json(raw, strict=True)
    except ValidationError as exc:
        raise InvalidPayload(
            _MESSAGE,
            errors=_errors((prefix + tuple(e["loc"]), e["msg"]) for e in exc.errors()),
        ) from exc


def _check_schema(schema: Mapping[str, Any], payload: Mapping[str, Any]) -> None:
    validator = jsonschema.Draft202012Validator(schema)
    problems = sorted(validator.iter_errors(dict(payload)), key=lambda e: list(e.path))
    if problems:
        errors = _errors((e.absolute_path, e.message) for e in problems)
        raise InvalidPayload(_MESSAGE, errors=errors)


def _errors(items: Iterable[tuple[Iterable[Any], str]]) -> list[dict[str, Any]]:
    """`[{"loc", "msg"}]`, at most 20, each message short: a huge payload must not make a huge
    error body (validators may quote the offending value)."""
    errors: list[dict[str, Any]] = []
    for loc, msg in items:
        if len(errors) == _MAX_FIELD_ERRORS:
            break
        if len(msg) > _MAX_ERROR_CHARS:
            msg = msg[: _MAX_ERROR_CHARS - 1] + "…"
        errors.append({"loc": [str(part) for part in loc], "msg": msg})
    return errors
