"""The answer to `message.send` is declared once (threadline_wire) for the server and the client."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

import threadline_client
from runtime.domain import Admission
from server.protocol.answers import admission_answer
from server.protocol.commands import BY_NAME
from threadline_wire import AdmissionAnswer, fields_doc

SHAPES = [
    Admission(thread_id="th_1", version=2, run_id="run_1", message_id="msg_1"),
    Admission(thread_id="th_1", version=3, queued_item_id="qi_1"),
    Admission(thread_id="th_1", version=3, run_id="run_1", message_id="msg_1", duplicate=True),
    # `interrupt`: the run to stop is the service's business, never the client's.
    Admission(thread_id="th_1", version=4, queued_item_id="qi_2", interrupted_run_id="run_0"),
]


def test_one_declaration_for_the_runtime_the_server_and_the_client() -> None:
    assert threadline_client.Admission is AdmissionAnswer
    assert issubclass(Admission, AdmissionAnswer)
    # The runtime adds only what stays inside the server; every wire field is the wire model's.
    assert set(Admission.model_fields) - set(AdmissionAnswer.model_fields) == {"interrupted_run_id"}
    assert BY_NAME["message.send"].answer_doc == fields_doc(AdmissionAnswer)
    assert fields_doc(AdmissionAnswer) == (
        '`{"thread_id", "version", "run_id"?, "message_id"?, "queued_item_id"?, "duplicate"?}`'
    )


@pytest.mark.parametrize("admission", SHAPES, ids=lambda a: str(a.version))
def test_what_the_server_answers_the_client_reads_back(admission: Admission) -> None:
    answer = admission_answer(admission)
    assert "interrupted_run_id" not in answer
    # Optional fields only when set: the body a client gets is the documented one.
    assert set(answer) == {"thread_id", "version"} | {
        name
        for name in ("run_id", "message_id", "queued_item_id", "duplicate")
        if getattr(admission, name)
    }
    read = threadline_client.Admission.model_validate(answer)
    assert read.model_dump() == admission.model_dump(exclude={"interrupted_run_id"})


def test_the_server_model_is_strict_and_the_client_lenient() -> None:
    with pytest.raises(ValidationError):
        Admission.model_validate({"thread_id": "t", "version": 1, "surprise": 1})
    newer = threadline_client.Admission.model_validate({"thread_id": "t", "version": 1, "x": 2})
    assert newer.model_extra == {"x": 2}  # a newer server's field is kept, not refused
