"""`/v1/embeddings` and `/v1/models` through the official `openai` client, in process: token id
arrays (tiktoken's, as OpenAI clients and LangChain send them; or the model's own tokenizer's),
the `model` field, and the models list."""

from __future__ import annotations

from collections.abc import Iterator
from importlib.resources import files
from pathlib import Path

import numpy as np
import openai
import pytest
import requests
import tiktoken
import tiktoken.registry
from fastapi.testclient import TestClient

from ragservice.config import Settings
from ragservice.embedding import token_ids
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


@pytest.fixture
def api_settings(api_settings: Settings, request: pytest.FixtureRequest) -> Settings:
    """RAGSERVICE_EMBEDDING_TOKEN_IDS as the test's `api_settings` parameter (default tiktoken)."""
    mode = getattr(request, "param", "tiktoken")
    return api_settings.model_copy(update={"embedding_token_ids": mode})


model_ids = pytest.mark.parametrize("api_settings", ["model"], indirect=True)
"""The token arrays of the test are the model's own tokenizer's."""


@pytest.fixture
def tiktoken_cache(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """cl100k_base offline: the copy llama-index-core ships in its package, as tiktoken's cache
    (for the service and for the clients that tokenize)."""
    cache = Path(str(files("llama_index.core") / "_static" / "tiktoken_cache"))
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    token_ids.forget_encodings()
    yield cache
    token_ids.forget_encodings()


def test_tiktoken_ids_embed_like_the_texts_they_came_from(
    client: TestClient, keys: Keys, embedder: SentenceTransformerEmbedder, tiktoken_cache: Path
) -> None:
    api = openai_client(client, keys.reader)
    cl100k = tiktoken.get_encoding("cl100k_base")
    texts = [*TEXTS, "Ünïcödé: 日本語のテキスト"]
    expected = embedder.embed(texts)

    from_ids = api.embeddings.create(model=embedder.name, input=cl100k.encode_batch(texts))
    np.testing.assert_allclose(vectors(from_ids), expected, atol=1e-5)
    # Usage counts the tokens the model read, as for the texts.
    from_texts = api.embeddings.create(model=embedder.name, input=texts)
    assert from_ids.usage.prompt_tokens == from_texts.usage.prompt_tokens
    one = api.embeddings.create(model=embedder.name, input=cl100k.encode(TEXTS[0]))
    np.testing.assert_allclose(vectors(one)[0], expected[0], atol=1e-5)

    gap = 100_261  # inside cl100k_base's range, but no token
    for bad, reason in (
        (
            [[9906], [cl100k.max_token_value + 1]],
            f"input[1]: token id {cl100k.max_token_value + 1}",
        ),
        ([[9906], [-1]], "input[1]: token id -1 is not in tiktoken's cl100k_base"),
        ([[9906, gap]], f"input[0]: token id {gap} is not in tiktoken's cl100k_base"),
        ([cl100k.encode("\U0001d518")[:1]], "input[0]: the token ids do not decode to UTF-8 text"),
        ([[]], "input[0]: no token ids"),
    ):
        with pytest.raises(openai.UnprocessableEntityError) as refused:
            api.embeddings.create(model=embedder.name, input=bad)
        assert reason in detail(refused)
    # The decoded texts are held to the text limits.
    long = client.post(
        "/v1/embeddings", json={"input": [cl100k.encode("a " * 4_001)]}, headers=keys.reader
    )
    assert long.status_code == 422
    assert "input[0]: 8002 characters" in long.json()["detail"]


def test_langchain_openai_embeddings_get_the_vectors_of_the_texts(
    client: TestClient, keys: Keys, embedder: SentenceTransformerEmbedder, tiktoken_cache: Path
) -> None:
    """LangChain's defaults: it tokenizes with tiktoken (cl100k_base for a model name OpenAI
    does not know) and sends the token arrays."""
    from langchain_openai import OpenAIEmbeddings

    lc = OpenAIEmbeddings(
        model="all-MiniLM-L6-v2",
        base_url="http://testserver/v1",
        api_key=keys.reader["Authorization"].removeprefix("Bearer "),  # type: ignore[arg-type]
        http_client=client,
        max_retries=0,
    )
    sent: list[object] = []
    client.event_hooks["request"].append(lambda r: sent.append(r.read()))
    texts = [TEXTS[0], "Ünïcödé: 日本語のテキスト"]
    documents = np.asarray(lc.embed_documents(texts), dtype=np.float32)
    query = np.asarray(lc.embed_query(TEXTS[1]), dtype=np.float32)
    assert b'"input":[[' in sent[0]  # token arrays, not texts
    reply = ok(
        client.post("/v1/embeddings", json={"input": [*texts, TEXTS[1]]}, headers=keys.reader)
    )
    by_text = np.asarray([row["embedding"] for row in reply["data"]], dtype=np.float32)
    np.testing.assert_allclose(documents, by_text[:2], atol=1e-5)
    np.testing.assert_allclose(query, by_text[2], atol=1e-5)


def test_without_the_tiktoken_encoding_token_arrays_are_refused_and_say_what_to_do(
    client: TestClient,
    keys: Keys,
    embedder: SentenceTransformerEmbedder,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    api = openai_client(client, keys.reader)

    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("tiktoken tried to download")

    monkeypatch.setattr(requests, "get", no_network)
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})  # none loaded in this process
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))  # an empty cache
    token_ids.forget_encodings()
    ids = [[9906, 1917]]
    with pytest.raises(openai.UnprocessableEntityError) as refused:
        api.embeddings.create(model=embedder.name, input=ids)
    message = detail(refused)
    assert "read as tiktoken cl100k_base ids, and this server cannot load that encoding" in message
    assert f"cl100k_base.tiktoken is not in TIKTOKEN_CACHE_DIR ({tmp_path}) as " in message
    assert (
        "Send the texts instead (LangChain: OpenAIEmbeddings(check_embedding_ctx_length=False))"
        in message
    )
    assert "'ragservice[tiktoken]'" in message
    assert not list(tmp_path.iterdir())  # nothing written

    # tiktoken not installed: the same refusal, naming the extra.
    missing = "Reading token id arrays needs tiktoken, which is not installed (pip install x)"
    monkeypatch.setattr(token_ids, "missing_extra", lambda extra, purpose: missing)
    with pytest.raises(openai.UnprocessableEntityError) as uninstalled:
        api.embeddings.create(model=embedder.name, input=ids)
    assert missing in detail(uninstalled)
    token_ids.forget_encodings()
    # Texts still embed.
    assert len(api.embeddings.create(model=embedder.name, input="pumps").data) == 1


@model_ids
def test_model_token_id_arrays_embed_like_the_texts_they_came_from(
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


@model_ids
def test_model_token_ids_the_model_cannot_read_are_refused_with_the_reason(
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
