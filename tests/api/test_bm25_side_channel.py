"""BM25's statistics are the searched collections' own, whoever asks (docs/permissions.md, "BM25
statistics and hidden documents"): N, the average length and each term's document frequency
count every chunk, those the asker may not read included. So a full-text score depends on
hidden documents, and a restricted writer can read from its own documents' scores how many
chunks it cannot read hold a word. These tests pin that documented behaviour, exact extension
and SQL statement alike; a change that makes statistics follow the asker must update the docs
with them."""

from __future__ import annotations

import math
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from ragservice.config import Settings
from ragservice.db import tenancy
from tests.api.conftest import Keys, ok, wait_for_job

HIDDEN_WORD = "kestrelwing"
"""A codename in hidden documents only."""
MADE_UP_WORD = "quokkafern"
PROBES = [
    {"external_id": "probe-hidden", "text": HIDDEN_WORD},
    {"external_id": "probe-made-up", "text": MADE_UP_WORD},
]
"""A writer's own one-word documents: a word of the hidden documents, and one of no document."""
"""A word in no document but the writer's own."""
HIDDEN = 7


@pytest.fixture(params=[True, False], ids=["exact", "sql"])
def api_settings(settings: Settings, request: pytest.FixtureRequest) -> Settings:
    """Both full-text paths: the exact extension's and the budgeted SQL statement's."""
    return settings.model_copy(
        update={"job_poll_seconds": 0.2, "workers": 1, "bm25_exact": request.param}
    )


def ingest(
    client: TestClient, headers: dict[str, str], collection: str, documents: list[dict[str, Any]]
) -> None:
    job = ok(
        client.post(
            f"/v1/collections/{collection}/documents",
            json={"documents": documents},
            headers=headers,
        ),
        202,
    )
    assert wait_for_job(client, job["id"], headers)["status"] == "done", job


def scores(
    client: TestClient, headers: dict[str, str], word: str, collections: list[str]
) -> dict[str, float]:
    """External id → full-text score of each hit for `word`."""
    body = {"query": word, "collections": collections, "mode": "fulltext", "k": 10}
    found = ok(client.post("/v1/search", json=body, headers=headers))["results"]
    return {hit["document"]["external_id"]: float(hit["score"]) for hit in found}


def hidden_documents(count: int, collection_tag: str = "") -> list[dict[str, Any]]:
    return [
        {
            "external_id": f"plan-{collection_tag}{i}",
            "text": f"Project {HIDDEN_WORD} closes the acquisition in quarter {i}.",
            "readers": ["group:board"],
        }
        for i in range(count)
    ]


def totals(client: TestClient, collections: list[str]) -> tuple[float, float]:
    """N and the average BM25 length over the named collections, as every asker's search
    scores them."""
    db = client.app.state.runtime.db  # type: ignore[attr-defined]
    with tenancy.as_system(), db.read() as session:
        n, tokens = session.execute(
            text(
                "SELECT sum(s.chunk_count), sum(s.token_count) FROM collection_text_stats s "
                "JOIN collections c ON c.id = s.collection_id AND c.tenant_id = s.tenant_id "
                "WHERE c.name = ANY(:names)"
            ),
            {"names": collections},
        ).one()
    return float(n), float(tokens) / float(n)


def idf(n: float, df: float) -> float:
    return math.log(1 + (n - df + 0.5) / (df + 0.5))


def test_a_restricted_writer_reads_hidden_document_frequencies_from_its_own_scores(
    client: TestClient, keys: Keys, api_settings: Settings
) -> None:
    """The writer key of no user reads the unrestricted documents only. Its two one-word
    documents differ only in their word, yet the one whose word is in hidden documents scores
    lower, and the ratio of the two scores gives the hidden count exactly."""
    db = client.app.state.runtime.db  # type: ignore[attr-defined]
    with tenancy.as_system(), db.read() as session:
        has_extension = session.scalar(
            text("SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'ragservice_bm25')")
        )
    assert has_extension or not api_settings.search.bm25_exact, "the exact path needs the extension"
    ok(client.post("/v1/collections", json={"name": "plans"}, headers=keys.admin), 201)
    ingest(client, keys.admin, "plans", hidden_documents(HIDDEN))
    ingest(client, keys.writer, "plans", PROBES)
    probed = scores(client, keys.writer, HIDDEN_WORD, ["plans"])
    control = scores(client, keys.writer, MADE_UP_WORD, ["plans"])
    # The writer sees its own document only, never the hidden ones...
    assert list(probed) == ["probe-hidden"] and list(control) == ["probe-made-up"]
    # ... and the same score an asker who reads everything gets for it.
    assert probed == pytest.approx(
        {k: v for k, v in scores(client, keys.admin, HIDDEN_WORD, ["plans"]).items() if k in probed}
    )
    # Statistics over what the writer may read would give both words df = 1 and equal scores.
    assert probed["probe-hidden"] < control["probe-made-up"] * 0.95
    # Same tf and length: the scores' ratio is the idfs' ratio; with N, the hidden df.
    n, _ = totals(client, ["plans"])
    target = probed["probe-hidden"] / control["probe-made-up"] * idf(n, 1)
    recovered = min(range(1, int(n) + 1), key=lambda df: abs(idf(n, df) - target))
    assert recovered == 1 + HIDDEN
    assert idf(n, recovered) == pytest.approx(target, rel=1e-9)


def test_a_readers_score_moves_when_hidden_documents_with_its_word_are_added(
    client: TestClient, keys: Keys
) -> None:
    """The reader key of no user: its score for an open chunk falls as hidden chunks holding the
    word are added, by what the whole collection's statistics predict."""
    ok(client.post("/v1/collections", json={"name": "plans"}, headers=keys.admin), 201)
    open_text = f"The {HIDDEN_WORD} budget is public."
    ingest(client, keys.writer, "plans", [{"external_id": "open", "text": open_text}])
    ingest(client, keys.writer, "plans", [{"external_id": "other", "text": "Lunch is at noon."}])
    before = scores(client, keys.reader, HIDDEN_WORD, ["plans"])["open"]
    ingest(client, keys.admin, "plans", hidden_documents(HIDDEN))
    after = scores(client, keys.reader, HIDDEN_WORD, ["plans"])
    assert list(after) == ["open"]
    assert after["open"] < before * 0.8


def test_statistics_are_per_collection_searched(client: TestClient, keys: Keys) -> None:
    """Hidden documents kept in a collection of their own do not move a search of the other
    collection; a search that names both collections scores with both collections' totals."""
    for name in ("open-notes", "board-only"):
        ok(client.post("/v1/collections", json={"name": name}, headers=keys.admin), 201)
    ingest(client, keys.writer, "open-notes", PROBES)
    alone = scores(client, keys.writer, HIDDEN_WORD, ["open-notes"])
    ingest(client, keys.admin, "board-only", hidden_documents(HIDDEN, "b"))
    assert scores(client, keys.writer, HIDDEN_WORD, ["open-notes"]) == pytest.approx(alone)
    control = scores(client, keys.writer, MADE_UP_WORD, ["open-notes"])
    assert alone["probe-hidden"] == pytest.approx(control["probe-made-up"], rel=1e-12)
    both = scores(client, keys.writer, HIDDEN_WORD, ["open-notes", "board-only"])
    assert list(both) == ["probe-hidden"]
    assert both["probe-hidden"] < alone["probe-hidden"] * 0.95
