"""The inference client over a real socket against `FakeOpenAI`: answers, streams, retries."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from ragservice.answering.inference import InferenceClient
from ragservice.answering.prompt import ChatMessage, build_messages
from ragservice.config import Settings
from ragservice.errors import ConfigurationError, UpstreamError, UpstreamTimeoutError
from tests.upstream import DEFAULT_ANSWER, FakeOpenAI, drop, ok, slow, status

pytestmark = pytest.mark.anyio

API_KEY = "sk-test-0123456789-secret"
MESSAGES = build_messages("What is the capital of France?", "[1] Paris is the capital.")
SAMPLING: dict[str, Any] = {"max_tokens": 64, "temperature": 0.0}


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(api_key=API_KEY) as server:
        yield server


def client_for(base_url: str, **overrides: Any) -> InferenceClient:
    """Small timeouts and backoffs so the failure paths run in milliseconds."""
    options: dict[str, Any] = {
        "model": "test-model",
        "api_key": API_KEY,
        "connect_timeout": 1.0,
        "read_timeout": 2.0,
        "max_retries": 2,
        "backoff_seconds": 0.01,
    }
    return InferenceClient(base_url, **{**options, **overrides})


def unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def collect(client: InferenceClient, messages: list[ChatMessage] = MESSAGES) -> list[str]:
    return [piece async for piece in client.stream(messages, **SAMPLING)]


# -- answers -------------------------------------------------------------------------------------


async def test_a_plain_completion_sends_the_openai_request_and_reads_the_answer(
    fake: FakeOpenAI,
) -> None:
    fake.enqueue(ok("Paris [1]."))
    async with client_for(fake.base_url) as client:
        completion = await client.complete(MESSAGES, max_tokens=64, temperature=0.2)

    assert completion.text == "Paris [1]."
    assert completion.model == "fake-model"
    assert (completion.prompt_tokens, completion.completion_tokens) == (10, 2)
    assert completion.finish_reason == "stop"
    [request] = fake.requests
    assert (request.method, request.path) == ("POST", "/v1/chat/completions")
    assert request.headers["authorization"] == f"Bearer {API_KEY}"
    assert request.body == {
        "model": "test-model",
        "messages": [m.to_dict() for m in MESSAGES],
        "max_tokens": 64,
        "temperature": 0.2,
        "stream": False,
    }


async def test_an_empty_script_answers_the_default_text_citing_source_one(
    fake: FakeOpenAI,
) -> None:
    async with client_for(fake.base_url + "/") as client:  # a trailing slash is fine too
        completion = await client.complete(MESSAGES, **SAMPLING)
    assert completion.text == DEFAULT_ANSWER
    assert "[1]" in completion.text


async def test_a_stream_yields_the_answer_piece_by_piece_then_reports_usage(
    fake: FakeOpenAI,
) -> None:
    text = "Paris is the capital of France [1]."
    fake.enqueue(ok(text, chunk_delay=0.01))
    async with client_for(fake.base_url) as client:
        stream = client.stream(MESSAGES, **SAMPLING)
        pieces = []
        async for piece in stream:
            assert stream.completion is None  # not before the end
            pieces.append(piece)

    assert len(pieces) >= 2
    assert "".join(pieces) == text
    assert stream.completion is not None
    assert stream.completion.text == text
    assert stream.completion.model == "fake-model"
    assert stream.completion.completion_tokens == len(pieces)
    assert stream.completion.finish_reason == "stop"
    [request] = fake.requests
    assert request.body["stream"] is True
    assert request.body["stream_options"] == {"include_usage": True}
    assert request.headers["accept"] == "text/event-stream"


async def test_events_over_several_data_lines_among_comments_and_fields_are_read_whole(
    fake: FakeOpenAI,
) -> None:
    # Each event's JSON spans several `data:` lines, sent one TCP chunk per line.
    text = "Paris is the capital.\nOf France [1]."
    fake.enqueue(ok(text, chunk_delay=0, model="multi-model", multiline=True))
    async with client_for(fake.base_url) as client:
        stream = client.stream(MESSAGES, **SAMPLING)
        pieces = [piece async for piece in stream]
    assert "".join(pieces) == text
    assert len(pieces) == len(text.split())
    assert stream.completion is not None
    assert stream.completion.model == "multi-model"
    assert stream.completion.completion_tokens == len(pieces)  # the usage-only event
    assert stream.completion.finish_reason == "stop"


async def test_a_stream_answered_with_another_content_type_is_an_upstream_error(
    fake: FakeOpenAI,
) -> None:
    fake.enqueue(status(200, body={"choices": []}))  # JSON, not text/event-stream
    async with client_for(fake.base_url) as client:
        with pytest.raises(UpstreamError, match="application/json content, not text/event"):
            await collect(client, MESSAGES)
    assert len(fake.requests) == 1  # not retried: the upstream does not stream


async def test_pieces_arrive_as_they_are_sent_not_all_at_the_end(fake: FakeOpenAI) -> None:
    fake.enqueue(ok("one two three four five six", chunk_delay=0.05))
    arrivals = []
    async with client_for(fake.base_url) as client:
        async for _ in client.stream(MESSAGES, **SAMPLING):
            arrivals.append(time.monotonic())
    # Buffered until the end, all six would arrive together; sent live, 0.05 s apart.
    assert arrivals[-1] - arrivals[0] >= 0.2


# -- retries -------------------------------------------------------------------------------------


async def test_429_with_retry_after_waits_that_long_then_succeeds(fake: FakeOpenAI) -> None:
    fake.enqueue(status(429, retry_after=1), ok("later"))
    async with client_for(fake.base_url) as client:
        started = time.monotonic()
        completion = await client.complete(MESSAGES, **SAMPLING)
        elapsed = time.monotonic() - started

    assert completion.text == "later"
    assert elapsed >= 1.0
    assert len(fake.requests) == 2


async def test_server_errors_are_retried_up_to_max_retries(fake: FakeOpenAI) -> None:
    fake.enqueue(status(500), status(503), ok("third time"))
    async with client_for(fake.base_url, max_retries=2) as client:
        completion = await client.complete(MESSAGES, **SAMPLING)
    assert completion.text == "third time"
    assert len(fake.requests) == 3


async def test_persistent_server_errors_fail_after_every_attempt(fake: FakeOpenAI) -> None:
    fake.enqueue(status(500), status(500), status(500), ok("never"))
    async with client_for(fake.base_url, max_retries=2) as client:
        with pytest.raises(UpstreamError) as caught:
            await client.complete(MESSAGES, **SAMPLING)

    assert type(caught.value) is UpstreamError
    assert "answered 500: scripted error 500" in str(caught.value)
    assert "after 3 attempts" in str(caught.value)
    assert len(fake.requests) == 3


async def test_no_retries_means_one_attempt(fake: FakeOpenAI) -> None:
    fake.enqueue(status(503), ok("never"))
    async with client_for(fake.base_url, max_retries=0) as client:
        with pytest.raises(UpstreamError) as caught:
            await client.complete(MESSAGES, **SAMPLING)
    assert str(caught.value) == "inference upstream answered 503: scripted error 503"
    assert len(fake.requests) == 1


async def test_a_client_error_fails_at_once_with_the_upstreams_message(fake: FakeOpenAI) -> None:
    fake.enqueue(status(400, body={"error": {"message": "max_tokens is too large"}}))
    async with client_for(fake.base_url) as client:
        with pytest.raises(UpstreamError, match="answered 400: max_tokens is too large"):
            await client.complete(MESSAGES, **SAMPLING)
    assert len(fake.requests) == 1


async def test_a_retry_after_longer_than_the_call_may_wait_fails_at_once(fake: FakeOpenAI) -> None:
    fake.enqueue(status(429, retry_after=120))
    async with client_for(fake.base_url) as client:
        started = time.monotonic()
        with pytest.raises(UpstreamError, match="retry after 120 s"):
            await client.complete(MESSAGES, **SAMPLING)
    assert time.monotonic() - started < 5  # not the 120 s asked for (slack for a busy machine)
    assert len(fake.requests) == 1


async def test_a_dropped_connection_is_retried(fake: FakeOpenAI) -> None:
    fake.enqueue(drop(), ok("reconnected"))
    async with client_for(fake.base_url) as client:
        assert (await client.complete(MESSAGES, **SAMPLING)).text == "reconnected"
    assert len(fake.requests) == 2


# -- timeouts and unreachable upstreams ----------------------------------------------------------


async def test_a_slow_answer_beyond_the_read_timeout_fails_quickly(fake: FakeOpenAI) -> None:
    fake.enqueue(slow(60))  # ended early by the timeout, so a long one costs nothing
    async with client_for(fake.base_url, read_timeout=0.3) as client:
        started = time.monotonic()
        with pytest.raises(UpstreamTimeoutError, match=r"within 0\.3 s"):
            await client.complete(MESSAGES, **SAMPLING)
        elapsed = time.monotonic() - started
    assert elapsed < 20  # far before the answer's 60 s, however busy the machine
    assert len(fake.requests) == 1  # a busy model is not asked twice


async def test_the_deadline_ends_a_stream_that_trickles_within_the_read_timeout(
    fake: FakeOpenAI,
) -> None:
    # 48 words 0.25 s apart: 12 s in all, each gap far within the read timeout.
    fake.enqueue(ok(" ".join(["word"] * 48), chunk_delay=0.25))
    pieces: list[str] = []
    async with client_for(fake.base_url, read_timeout=3.0, deadline_seconds=0.5) as client:
        started = time.monotonic()
        with pytest.raises(UpstreamTimeoutError, match=r"within 0\.5 s"):
            async for piece in client.stream(MESSAGES, **SAMPLING):
                pieces.append(piece)
        elapsed = time.monotonic() - started
    assert 1 <= len(pieces) < 48
    assert elapsed < 6  # half the whole stream's 12 s, however busy the machine


async def test_nothing_listening_is_an_upstream_error() -> None:
    base_url = f"http://127.0.0.1:{unused_port()}/v1"
    async with client_for(base_url, max_retries=1, connect_timeout=10.0) as client:
        started = time.monotonic()
        with pytest.raises(UpstreamError, match="could not be reached") as caught:
            await client.complete(MESSAGES, **SAMPLING)
    assert not isinstance(caught.value, UpstreamTimeoutError)
    assert "after 2 attempts" in str(caught.value)
    assert API_KEY not in str(caught.value)
    assert time.monotonic() - started < 5  # refused at once: no connect timeout waited


# -- the API key ---------------------------------------------------------------------------------


async def test_the_api_key_is_sent_and_never_shows_in_errors(fake: FakeOpenAI) -> None:
    echo = {"error": {"message": f"Incorrect API key provided: {API_KEY}"}}
    fake.enqueue(status(401, body=echo))
    async with client_for(fake.base_url) as client:
        with pytest.raises(UpstreamError) as caught:
            await client.complete(MESSAGES, **SAMPLING)

    assert fake.requests[0].headers["authorization"] == f"Bearer {API_KEY}"
    assert "answered 401: Incorrect API key provided: ***" in str(caught.value)
    assert API_KEY not in str(caught.value)
    assert API_KEY not in repr(caught.value)


async def test_a_wrong_key_is_refused_by_the_fake(fake: FakeOpenAI) -> None:
    async with client_for(fake.base_url, api_key="sk-wrong") as client:
        with pytest.raises(UpstreamError, match="answered 401"):
            await client.complete(MESSAGES, **SAMPLING)


# -- streams failing -----------------------------------------------------------------------------


async def test_a_stream_failing_before_its_first_token_is_retried(fake: FakeOpenAI) -> None:
    fake.enqueue(drop(), status(503), ok("second wind"))
    async with client_for(fake.base_url) as client:
        assert "".join(await collect(client)) == "second wind"
    assert [r.streamed for r in fake.requests] == [True, True, True]


async def test_a_stream_failing_after_its_first_token_is_not_retried(fake: FakeOpenAI) -> None:
    fake.enqueue(drop(after_chunks=2), ok("never asked"))
    pieces: list[str] = []
    async with client_for(fake.base_url) as client:
        with pytest.raises(UpstreamError, match="closed the connection"):
            async for piece in client.stream(MESSAGES, **SAMPLING):
                pieces.append(piece)
    assert len(pieces) == 2
    assert len(fake.requests) == 1


async def test_a_stream_closed_early_is_stopped_cleanly(fake: FakeOpenAI) -> None:
    fake.enqueue(ok("one two three four", chunk_delay=0.05))
    async with client_for(fake.base_url) as client:
        stream = client.stream(MESSAGES, **SAMPLING)
        assert await anext(stream) == "one "
        await stream.aclose()
        assert stream.completion is None
        # The client is still usable afterwards.
        assert (await client.complete(MESSAGES, **SAMPLING)).text == DEFAULT_ANSWER


# -- odd answers and configuration ---------------------------------------------------------------


async def test_a_success_that_is_not_a_completion_is_an_upstream_error(fake: FakeOpenAI) -> None:
    fake.enqueue(status(200, body="<html>proxy login</html>"))
    async with client_for(fake.base_url) as client:
        with pytest.raises(UpstreamError, match="something other than a completion"):
            await client.complete(MESSAGES, **SAMPLING)


async def test_from_settings_builds_a_client_only_when_a_url_is_set() -> None:
    assert InferenceClient.from_settings(Settings(inference_url=None)) is None
    configured = InferenceClient.from_settings(
        Settings(inference_url="http://localhost:9/v1", inference_model="llama")
    )
    assert configured is not None
    assert configured.model == "llama"
    await configured.aclose()


@pytest.mark.parametrize("url", ["http://llm.example.com/v1", "http://10.0.0.7:8000/v1"])
def test_a_key_is_never_sent_over_plain_http_to_another_machine(url: str) -> None:
    with pytest.raises(ConfigurationError, match="clear text"):
        InferenceClient(url, model="m", api_key="sk-secret")


@pytest.mark.parametrize(
    ("url", "api_key"),
    [
        ("https://llm.example.com/v1", "sk-secret"),
        ("http://localhost:8000/v1", "sk-secret"),
        ("http://127.0.0.1:8000/v1", "sk-secret"),
        ("http://[::1]:8000/v1", "sk-secret"),
        ("http://llm.example.com/v1", None),
    ],
)
async def test_https_loopback_or_no_key_is_fine(url: str, api_key: str | None) -> None:
    client = InferenceClient(url, model="m", api_key=api_key)
    await client.aclose()


def test_a_url_without_a_scheme_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="RAGSERVICE_INFERENCE_URL"):
        InferenceClient("localhost:8000/v1", model="m")
