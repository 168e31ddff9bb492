"""The official `openai` package, pointed at a real `ragservice serve`, which answers from its
collections through a fake OpenAI-compatible upstream on another local port."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.e2e.test_server import create_key, start_server, stop, wait_for_job, wait_until_ready
from tests.upstream import FakeOpenAI, drop
from tests.upstream import ok as answer


@pytest.fixture
def upstream() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake:
        yield fake


def test_openai_client_chat_streaming_and_embeddings(
    server_env: dict[str, str], upstream: FakeOpenAI
) -> None:
    env = {**server_env, "RAGSERVICE_INFERENCE_URL": upstream.base_url}
    base, process = start_server(env)
    try:
        wait_until_ready(base, process)
        key = create_key(env)
        _load_handbook(base, key)
        client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)

        upstream.enqueue(answer("Sixteen weeks of parental leave [1]."))
        reply = client.chat.completions.create(
            model="rag:handbook",
            messages=[{"role": "user", "content": "How long is parental leave?"}],
        )
        content = reply.choices[0].message.content or ""
        assert content.startswith("Sixteen weeks of parental leave [1].")
        assert "Sources:\n[1] Leave (leave)" in content
        assert reply.model_extra is not None and reply.model_extra["citations"][0]["number"] == 1

        upstream.enqueue(answer("Through the travel desk [1]."))
        stream = client.chat.completions.create(
            model="rag:handbook",
            messages=[{"role": "user", "content": "How do I book travel?"}],
            stream=True,
        )
        pieces = [chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices]
        assert len(pieces) > 3
        assert "".join(pieces).startswith("Through the travel desk [1].")

        upstream.enqueue(drop(after_chunks=2))  # cut mid-answer: the error event ends the stream
        stream = client.chat.completions.create(
            model="rag:handbook",
            messages=[{"role": "user", "content": "Who books the trips?"}],
            stream=True,
        )
        with pytest.raises(openai.APIError) as cut:
            list(stream)
        assert cut.value.body == "Upstream"  # as for a failure before the stream (`error`)

        vectors = client.embeddings.create(model="all-MiniLM-L6-v2", input=["one", "two"])
        assert [len(v.embedding) for v in vectors.data] == [384, 384]

        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(
                model="gpt-4o", messages=[{"role": "user", "content": "x"}]
            )
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{base}/v1", api_key="rsk_wrong", max_retries=0).models.list()
    finally:
        if process.poll() is None:
            stop(process)


def _load_handbook(base: str, key: str) -> None:
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=30) as c:
        assert c.post("/v1/collections", json={"name": "handbook"}).status_code == 201
        documents = [
            {
                "external_id": "leave",
                "title": "Leave",
                "text": "Parents get sixteen weeks of leave.",
            },
            {"external_id": "travel", "title": "Travel", "text": "Book trips at the travel desk."},
        ]
        job = c.post("/v1/collections/handbook/documents", json={"documents": documents}).json()
        assert wait_for_job(c, job["id"])["status"] == "done"
