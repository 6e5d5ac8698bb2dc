"""The answer to `message.send` (HTTP 202 body and websocket `ack`), and its one-line doc."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class AdmissionAnswer(BaseModel):
    """What sending a message did: a new run, a queued item, or (`duplicate`) the first
    request's outcome for a repeated `client_request_id`.

    Lenient on input: a newer server may add fields and an older client must still parse the
    answer (docs/protocol.md: clients ignore what they do not know). The server's own
    `runtime.domain.Admission` extends this model, strictly, with what stays inside it.
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    thread_id: str
    version: int
    run_id: str | None = None
    message_id: str | None = None
    queued_item_id: str | None = None
    duplicate: bool = False

    def to_wire(self) -> dict[str, Any]:
        """The answer body: the declared fields only, each optional one only when set."""
        return self.model_dump(include=set(AdmissionAnswer.model_fields), exclude_defaults=True)


def fields_doc(model: type[BaseModel]) -> str:
    """`{"a", "b"?}`: the model's fields as docs/protocol.md lists them, optional ones with `?`."""
    names = [
        f'"{name}"' if field.is_required() else f'"{name}"?'
        for name, field in model.model_fields.items()
    ]
    return "`{" + ", ".join(names) + "}`"
