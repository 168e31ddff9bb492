"""The server-sent-event frames both streaming endpoints write (`ragservice.api.sse`)."""

from __future__ import annotations

from ragservice.api.sse import frame


def test_a_named_event_carries_its_data_as_json_unescaped() -> None:
    assert frame({"text": "café [1]"}, "token") == 'event: token\ndata: {"text": "café [1]"}\n\n'


def test_an_unnamed_event_and_a_plain_string() -> None:
    assert frame({"error": "ServiceStopping"}) == 'data: {"error": "ServiceStopping"}\n\n'
    assert frame("[DONE]") == "data: [DONE]\n\n"
