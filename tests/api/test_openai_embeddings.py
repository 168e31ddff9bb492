"""`/v1/embeddings` and `/v1/models` through the official `openai` client, in process: token id
arrays of the model's own tokenizer, the `model` field, and the models list."""

from __future__ import annotations

import numpy as np
import openai
import pytest
from fastapi.testclient import TestClient

from ragservice.embedding.embedder import SentenceTransformerEmbedder
from tests.api.conftest import Keys, ok

TEXTS = ["Parental leave is sixteen weeks.", "Book trips at the travel desk."]


def openai_client(client: TestClient, headers: dict[str, str]) -> openai.OpenAI:
    """The `openai` client speaking to the app through the test client (an httpx.Client)."""
    key = headers["Authorization"].removeprefix("Bearer ")
    return openai.OpenAI(
        base_url="http://testserver/v1", api_key=key, http_client=client, max_retries=0
    )


def detail(error: pytest.ExceptionInfo[openai.APIStatusError]) -> str:
    """The service's message (its error body's `detail`; the client's own text shows the
    status only, as the body's `error` is a name, not OpenAI's object)."""
    return str(error.value.response.json()["detail"])


def vectors(reply: openai.types.CreateEmbeddingResponse) -> np.ndarray:
    return np.asarray([row.embedding for row in reply.data], dtype=np.float32)


def test_token_id_arrays_embed_like_the_texts_they_came_from(
    client: TestClient, keys: Keys, embedder: SentenceTransformerEmbedder
) -> None:
    api = openai_client(client, keys.reader)
    tokenizer = embedder.model.tokenizer
    ids = [tokenizer.encode(text, add_special_tokens=False) for text in TEXTS]
    expected = embedder.embed(TEXTS)

    from_texts = api.embeddings.create(model=embedder.name, input=TEXTS)
    from_ids = api.embeddings.create(model=embedder.name, input=ids)  # a list of lists
    np.testing.assert_allclose(vectors(from_texts), expected, atol=1e-5)
    np.testing.assert_allclose(vectors(from_ids), expected, atol=1e-5)
    assert from_ids.model == embedder.name
    # Special tokens counted, as for texts.
    assert (
        from_ids.usage.prompt_tokens
        == from_texts.usage.prompt_tokens
        == sum(len(i) + 2 for i in ids)
    )

    one = api.embeddings.create(model=embedder.name, input=ids[0])  # one text's ids
    assert len(one.data) == 1
    np.testing.assert_allclose(vectors(one)[0], expected[0], atol=1e-5)
    # Ids with the special tokens already around them are taken as they are.
    framed = api.embeddings.create(model=embedder.name, input=[tokenizer.encode(TEXTS[1])])
    np.testing.assert_allclose(vectors(framed)[0], expected[1], atol=1e-5)


def test_token_ids_the_model_cannot_read_are_refused_with_the_reason(
    client: TestClient, keys: Keys, embedder: SentenceTransformerEmbedder
) -> None:
    api = openai_client(client, keys.reader)
    vocabulary = embedder.batch_tokenizer.vocab_size  # type: ignore[union-attr]
    with pytest.raises(openai.UnprocessableEntityError) as outside:
        api.embeddings.create(model=embedder.name, input=[[101, 2000], [2000, vocabulary]])
    message = detail(outside)
    assert f"input[1]: token id {vocabulary} is outside the vocabulary" in message
    assert "tiktoken" in message  # says whose ids these must not be
    with pytest.raises(openai.UnprocessableEntityError) as long:
        api.embeddings.create(model=embedder.name, input=[2000] * 255)
    assert "input[0]: 255 tokens; the model reads at most 254" in detail(long)
    with pytest.raises(openai.UnprocessableEntityError) as empty:
        api.embeddings.create(model=embedder.name, input=[[]])
    assert "input[0]: no token ids" in detail(empty)
    negative = client.post("/v1/embeddings", json={"input": [5, -1]}, headers=keys.reader)
    assert negative.status_code == 422
    mixed = client.post("/v1/embeddings", json={"input": ["text", 5]}, headers=keys.reader)
    assert mixed.status_code == 422
    count = client.post("/v1/embeddings", json={"input": [[5]] * 257}, headers=keys.reader)
    assert count.status_code == 413
    assert "RAGSERVICE_MAX_EMBEDDING_INPUTS" in count.json()["detail"]


def test_the_model_field_names_a_served_model_or_is_refused(
    client: TestClient, keys: Keys, embedder: SentenceTransformerEmbedder
) -> None:
    api = openai_client(client, keys.reader)
    serving = client.app.state.runtime.models.current()  # type: ignore[attr-defined]
    for name in (serving.name, f"{serving.name}:{serving.version}", "all-MiniLM-L6-v2"):
        assert api.embeddings.create(model=name, input="pumps").model == serving.name
    with pytest.raises(openai.NotFoundError) as unknown:
        api.embeddings.create(model="text-embedding-3-small", input="pumps")
    assert "'text-embedding-3-small' not found" in detail(unknown)
    assert f"this server embeds with {serving.name} " in detail(unknown)
    # Not sending one (the field is optional here) embeds with the serving model.
    reply = ok(client.post("/v1/embeddings", json={"input": "pumps"}, headers=keys.reader))
    assert reply["model"] == serving.name


def test_models_lists_the_chat_models_of_the_tenant_and_the_embedding_model(
    client: TestClient, keys: Keys, embedder: SentenceTransformerEmbedder
) -> None:
    ok(client.post("/v1/collections", json={"name": "hr"}, headers=keys.writer), 201)
    listed = {m.id: m for m in openai_client(client, keys.reader).models.list()}
    assert set(listed) == {"rag", "rag:hr", embedder.name}
    assert listed["rag:hr"].model_extra == {"type": "chat"}
    assert listed[embedder.name].model_extra == {"type": "embedding", "dimension": 384}
    assert listed[embedder.name].owned_by == "ragservice"
    others = {m.id for m in openai_client(client, keys.other_tenant).models.list()}
    assert others == {"rag", embedder.name}  # another tenant's collections are not listed
