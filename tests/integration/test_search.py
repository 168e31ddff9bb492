"""Retrieval against a real PostgreSQL: ranking order, BM25 against a Python reference, the
postings triggers, HNSW use, filters, tenant isolation and hybrid fusion.

Read-only tests share one database per module (built once from the migrated template); tests
that change documents get a database of their own.
"""

from __future__ import annotations

import math
import re
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import psycopg
import pytest
from psycopg import sql
from sqlalchemy import text
from sqlalchemy.engine import make_url

from ingest.pipeline import IngestPipeline, text_hash
from ragservice import store
from ragservice.config import Settings
from ragservice.db import Database, tenancy
from ragservice.embedding.embedder import SentenceTransformerEmbedder, Vectors
from ragservice.retrieval.filters import parse_and_compile
from ragservice.retrieval.fusion import Fusion
from ragservice.retrieval.search import Mode, Searcher, SearchHit, SearchOptions, SearchResult
from ragservice.runtime import Runtime, open_runtime
from ragservice.types import LoadedDocument, TextChunk

GUIDE = "# Guide\n\nIntro text.\n\n## Install\n\nRun the installer.\n\n## Use\n\nAsk questions."
TWIN = "Fish oil supplements lower triglycerides."

CORPUS: dict[str, tuple[str, dict[str, Any]]] = {
    "aspirin": (
        "Aspirin reduces the risk of heart attacks in adults by inhibiting platelets.",
        {"year": 2020, "source": "pubmed", "published": "2020-03-01", "tags": ["cardio", "drug"]},
    ),
    "statins": (
        "Statins lower LDL cholesterol levels in the blood.",
        {"year": 2018, "source": "pubmed", "published": "2018-11-15", "tags": ["cardio"]},
    ),
    "vitamin": (
        "Vitamin D deficiency is linked to bone fractures in older women.",
        {"year": 2021, "source": "arxiv", "published": "2021-01-20"},
    ),
    "sleep": (
        "Poor sleep quality raises the risk of obesity and type 2 diabetes.",
        {"year": 2019, "source": "arxiv", "published": "2019-07-04"},
    ),
    # A year stored as a string: number ranges must skip it without an error.
    "exercise": (
        "Regular aerobic exercise improves fitness and lowers blood pressure.",
        {"year": "2020", "source": "pubmed"},
    ),
    "coffee": (
        "Drinking coffee is associated with a lower risk of liver disease.",
        {"year": 2022, "source": "pubmed", "published": "2022-05-30", "flag": None},
    ),
    "smoking": (
        "Smoking causes lung cancer and chronic obstructive pulmonary disease.",
        {"year": 2015, "source": "other", "published": "2015-12-31T23:59:00"},
    ),
    "zinc": (
        "Zinc lozenges may shorten the duration of the common cold.",
        {"year": 2017.5, "tags": ["drug"]},
    ),
    "malaria": (
        "Bed nets treated with insecticide prevent malaria in children.",
        {"year": 2016, "source": "arxiv"},
    ),
    "antibiotics": (
        "Overuse of antibiotics drives bacterial resistance in hospitals.",
        {"year": 2023, "source": "pubmed", "published": "2023-02-14"},
    ),
    "gut": ("The gut microbiome influences immune responses and inflammation.", {"year": 2024}),
    "measles": (
        "Measles vaccination gives lasting immunity to nearly all children.",
        {"year": 2014, "source": "other"},
    ),
    "twin-1": (TWIN, {"year": 2000}),
    "twin-2": (TWIN, {"year": 2000}),
    "guide": (GUIDE, {}),
}
ALL = set(CORPUS)

RRF_K = SearchOptions().rrf_k


def loaded(external_id: str, body: str, metadata: dict[str, Any]) -> LoadedDocument:
    return LoadedDocument(
        external_id=external_id,
        text=body,
        title=f"Title {external_id}",
        metadata=metadata,
        format="markdown" if body.startswith("#") else "text",
    )


DOCS = [loaded(key, body, meta) for key, (body, meta) in CORPUS.items()]


class CachingEmbedder:
    """The real model, remembering vectors so each module's corpus is embedded once."""

    cache: dict[str, npt.NDArray[np.float32]] = {}  # noqa: RUF012  # shared on purpose

    def __init__(self, inner: SentenceTransformerEmbedder) -> None:
        self.inner = inner

    name = property(lambda self: self.inner.name)
    dimension = property(lambda self: self.inner.dimension)
    max_tokens = property(lambda self: self.inner.max_tokens)
    tokenizer = property(lambda self: self.inner.tokenizer)
    batch_tokenizer = None  # texts only: `embed` sees every text the pipeline embeds

    def embed(self, texts: Sequence[str]) -> Vectors:
        missing = [t for t in dict.fromkeys(texts) if t not in self.cache]
        if missing:
            self.cache.update(zip(missing, self.inner.embed(missing), strict=True))
        return np.stack([self.cache[t] for t in texts]) if texts else self.inner.embed([])

    def query(self, query: str) -> npt.NDArray[np.float32]:
        vector: npt.NDArray[np.float32] = self.embed([query])[0]
        return vector


# -- fixtures --------------------------------------------------------------------------------


def _admin(admin_url: str, statement: sql.Composed) -> None:
    url = make_url(admin_url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(statement)


@pytest.fixture(scope="module")
def shared_url(pg_admin_url: str, template_url: str) -> Iterator[str]:
    """One migrated database for the read-only tests of this module."""
    name = f"rs_search_{uuid.uuid4().hex[:12]}"
    template = make_url(template_url).database
    _admin(
        pg_admin_url,
        sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
            sql.Identifier(name), sql.Identifier(str(template))
        ),
    )
    yield make_url(pg_admin_url).set(database=name).render_as_string(hide_password=False)
    _admin(pg_admin_url, sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


def _open(url: str, data_dir: Path, embedder: SentenceTransformerEmbedder) -> Runtime:
    settings = Settings(database_url=url, data_dir=data_dir, chunk_overlap_tokens=8)
    return open_runtime(settings, embedder=embedder)


@pytest.fixture(scope="module")
def corpus(
    shared_url: str,
    tmp_path_factory: pytest.TempPathFactory,
    embedder: SentenceTransformerEmbedder,
) -> Iterator[Corpus]:
    """CORPUS in collection `papers` of the default tenant, a copy of it in another tenant's
    `papers`, and in `bulk` 1,000 one-chunk documents with random 8-dimensional vectors of a
    model of their own (small vectors keep the HNSW inserts fast)."""
    runtime = _open(shared_url, tmp_path_factory.mktemp("search"), embedder)
    caching = CachingEmbedder(embedder)
    with tenancy.as_system():  # module-scoped: set up before the per-test `across_tenants`
        other_tenant = _create_tenant(runtime, "other")
        ingest(runtime, caching, DOCS, collection="papers")
        ingest(runtime, caching, DOCS, collection="papers", tenant_id=other_tenant)
        bulk_model, bulk_vectors = _write_bulk(runtime, n=2000)
        searcher = make_searcher(runtime, caching)
        corpus = Corpus(
            runtime=runtime,
            searcher=searcher,
            papers=collection_id(runtime, "papers"),
            other=collection_id(runtime, "papers", tenant_id=other_tenant),
            bulk=collection_id(runtime, "bulk"),
            bulk_model=bulk_model,
            bulk_vectors=bulk_vectors,
        )
    yield corpus
    searcher.close()
    runtime.close()


class Corpus:
    def __init__(
        self,
        *,
        runtime: Runtime,
        searcher: Searcher,
        papers: uuid.UUID,
        other: uuid.UUID,
        bulk: uuid.UUID,
        bulk_model: int,
        bulk_vectors: npt.NDArray[np.float32],
    ) -> None:
        self.runtime = runtime
        self.searcher = searcher
        self.papers = papers
        self.other = other
        self.bulk = bulk
        self.bulk_model = bulk_model
        self.bulk_vectors = bulk_vectors

    def search(
        self, query: str, collections: Sequence[uuid.UUID] | None = None, **options: Any
    ) -> SearchResult:
        filters = parse_and_compile(options.pop("filters", None))
        return self.searcher.search(
            collection_ids=[self.papers] if collections is None else collections,
            query=query,
            options=SearchOptions(filters=filters, **options),
        )


def make_searcher(runtime: Runtime, caching: CachingEmbedder) -> Searcher:
    return Searcher(
        runtime.db, caching.query, model_id=runtime.model_id, dimension=caching.dimension
    )


def ingest(
    runtime: Runtime,
    embedder: CachingEmbedder,
    docs: Sequence[LoadedDocument],
    *,
    collection: str,
    tenant_id: uuid.UUID | None = None,
) -> None:
    pipeline = IngestPipeline(
        runtime.db,
        embedder,  # type: ignore[arg-type]
        model_id=runtime.model_id,
        tenant_id=tenant_id or runtime.default_tenant_id,
        chunking=runtime.chunking_options(),
        batch_chunks=512,
    )
    report = pipeline.run(docs, collection=collection)
    assert report.ok


def _create_tenant(runtime: Runtime, name: str) -> uuid.UUID:
    with runtime.db.write() as session:
        found = session.execute(
            text("INSERT INTO tenants (name) VALUES (:n) RETURNING id"), {"n": name}
        ).scalar_one()
    assert isinstance(found, uuid.UUID)
    return found


def collection_id(runtime: Runtime, name: str, tenant_id: uuid.UUID | None = None) -> uuid.UUID:
    with runtime.db.read() as session:
        found = store.collections.find_collection_id(
            session, tenant_id or runtime.default_tenant_id, name
        )
    assert found is not None
    return found


BULK_DIMENSION = 8


def _write_bulk(runtime: Runtime, *, n: int) -> tuple[int, npt.NDArray[np.float32]]:
    """n one-chunk documents with random unit vectors; `group` = i % 50 (so group 0 is 2%)."""
    rng = np.random.default_rng(7)
    vectors = rng.standard_normal((n, BULK_DIMENSION)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    writes = [_bulk_document(i, vectors[i : i + 1]) for i in range(n)]
    with runtime.db.write() as session:
        model = store.embedding_models.ensure_model(
            session,
            name="random-8d",
            dimension=BULK_DIMENSION,
            path=None,
            hnsw_m=16,
            hnsw_ef_construction=64,
        )
        bulk = store.collections.ensure_collection(session, runtime.default_tenant_id, "bulk")
        store.documents.write_documents(
            session,
            tenant_id=runtime.default_tenant_id,
            collection_id=bulk,
            model_id=model.id,
            documents=writes,
        )
        session.execute(text("ANALYZE"))
    return model.id, vectors


def _bulk_document(i: int, vector: npt.NDArray[np.float32]) -> store.documents.DocumentWrite:
    body = f"Synthetic record {i} of group {i % 50}."
    chunk = TextChunk(ordinal=0, text=body, start_char=0, end_char=len(body), token_count=8)
    return store.documents.DocumentWrite(
        external_id=f"bulk-{i}",
        title=None,
        source="",
        metadata={"group": i % 50},
        content_hash=text_hash(body),
        char_count=len(body),
        chunks=[chunk],
        chunk_hashes=[text_hash(body)],
        embeddings=vector,
    )


def ids(result: SearchResult) -> list[str]:
    return [hit.external_id for hit in result.hits]


# -- BM25 reference --------------------------------------------------------------------------


def reference_bm25(
    runtime: Runtime, collection: uuid.UUID, query: str, *, k1: float, b: float
) -> dict[uuid.UUID, float]:
    """BM25 (Lucene idf) computed in Python from the chunks' own tsvectors."""
    with runtime.db.read() as session:
        lexemes = set(
            session.execute(
                text("SELECT tsvector_to_array(to_tsvector('english', :q))"), {"q": query}
            ).scalar_one()
        )
        rows = session.execute(
            text(
                "SELECT c.id, t.lexeme, coalesce(array_length(t.positions, 1), 1) "
                "FROM chunks c CROSS JOIN LATERAL unnest(to_tsvector('english', c.text)) AS t "
                "WHERE c.collection_id = :c"
            ),
            {"c": collection},
        ).all()
        chunk_count = session.execute(
            text("SELECT count(*) FROM chunks WHERE collection_id = :c"), {"c": collection}
        ).scalar_one()
    tf: dict[uuid.UUID, dict[str, int]] = {}
    for chunk, lexeme, count in rows:
        tf.setdefault(chunk, {})[lexeme] = count
    lengths = {chunk: sum(terms.values()) for chunk, terms in tf.items()}
    avgdl = sum(lengths.values()) / chunk_count
    df = Counter(lexeme for terms in tf.values() for lexeme in terms if lexeme in lexemes)
    scores: dict[uuid.UUID, float] = {}
    for chunk, terms in tf.items():
        matched = [t for t in terms if t in lexemes]
        if matched:
            scores[chunk] = sum(
                math.log(1 + (chunk_count - df[t] + 0.5) / (df[t] + 0.5))
                * terms[t]
                * (k1 + 1)
                / (terms[t] + k1 * (1 - b + b * lengths[chunk] / avgdl))
                for t in matched
            )
    return scores


def assert_matches_reference(hits: list[SearchHit], expected: dict[uuid.UUID, float]) -> None:
    ranked = sorted(expected.items(), key=lambda item: (-item[1], item[0]))
    assert [h.chunk_id for h in hits] == [chunk for chunk, _ in ranked][: len(hits)]
    for hit in hits:
        assert hit.score == pytest.approx(expected[hit.chunk_id], rel=1e-9)


# -- ranking ---------------------------------------------------------------------------------


def test_bm25_ranks_the_rare_term_first(corpus: Corpus) -> None:
    # "risk" is in three documents, "cancer" in one: the rare term decides.
    result = corpus.search("risk of cancer", mode=Mode.FULLTEXT, k=10)
    assert ids(result)[0] == "smoking"
    assert set(ids(result)) == {"smoking", "aspirin", "sleep", "coffee"}
    assert all(a.score >= b.score for a, b in zip(result.hits, result.hits[1:], strict=False))


@pytest.mark.parametrize(("k1", "b"), [(0.9, 0.4), (1.2, 0.75)])
@pytest.mark.parametrize("query", ["risk of heart disease in adults", "lower blood cholesterol"])
def test_bm25_scores_equal_the_reference(corpus: Corpus, query: str, k1: float, b: float) -> None:
    result = corpus.search(query, mode=Mode.FULLTEXT, k=50, bm25_k1=k1, bm25_b=b)
    expected = reference_bm25(corpus.runtime, corpus.papers, query, k1=k1, b=b)
    assert len(result.hits) == len(expected) > 3
    assert_matches_reference(result.hits, expected)


def test_dense_finds_a_paraphrase_with_no_shared_word(corpus: Corpus) -> None:
    query = "medication for hypercholesterolemia"
    assert "statins" not in ids(corpus.search(query, mode=Mode.FULLTEXT))
    dense = corpus.search(query, mode=Mode.DENSE, k=3)
    assert ids(dense)[0] == "statins"
    # Cosine similarity, not distance: higher is better, and at most 1.
    assert 0 < dense.hits[2].score <= dense.hits[0].score <= 1


def test_dense_scores_are_cosine_similarities(corpus: Corpus) -> None:
    hit = corpus.search(CORPUS["zinc"][0], mode=Mode.DENSE, k=1).hits[0]
    assert hit.external_id == "zinc"
    assert hit.score == pytest.approx(1.0, abs=1e-5)


def test_hybrid_is_reciprocal_rank_fusion_of_both_lists(corpus: Corpus) -> None:
    query = "medication for hypercholesterolemia and heart attack risk"
    dense = corpus.search(query, mode=Mode.DENSE, k=5)
    fulltext = corpus.search(query, mode=Mode.FULLTEXT, k=5)
    hybrid = corpus.search(
        query,
        mode=Mode.HYBRID,
        k=4,
        dense_candidates=5,
        text_candidates=5,
        rrf_k=10,
        fusion=Fusion.RRF,
    )

    fused: dict[uuid.UUID, float] = {}
    for ranking in (dense, fulltext):
        for rank, hit in enumerate(ranking.hits, start=1):
            fused[hit.chunk_id] = fused.get(hit.chunk_id, 0.0) + 1 / (10 + rank)
    expected = sorted(fused.items(), key=lambda item: (-item[1], item[0]))[:4]
    assert [h.chunk_id for h in hybrid.hits] == [chunk for chunk, _ in expected]
    assert [h.score for h in hybrid.hits] == pytest.approx([score for _, score in expected])
    # Each side's best is in the fused list: the paraphrase (dense only) and the word match.
    assert {"statins", fulltext.hits[0].external_id} <= set(ids(hybrid))


def test_hybrid_falls_back_to_dense_when_the_query_has_only_stop_words(corpus: Corpus) -> None:
    query = "what is it about them"
    assert corpus.search(query, mode=Mode.FULLTEXT).hits == []
    hybrid = corpus.search(query, mode=Mode.HYBRID, k=5)
    dense = corpus.search(query, mode=Mode.DENSE, k=5)
    assert [h.chunk_id for h in hybrid.hits] == [h.chunk_id for h in dense.hits]
    rrf = corpus.search(query, mode=Mode.HYBRID, k=5, fusion=Fusion.RRF)
    assert rrf.hits[0].score == pytest.approx(1 / (RRF_K + 1))


def test_empty_query_does_not_crash(corpus: Corpus) -> None:
    for mode in Mode:
        result = corpus.search("", mode=mode, k=3)
        assert len(result.hits) == (0 if mode is Mode.FULLTEXT else 3)


def test_hits_carry_the_chunk_and_its_document(corpus: Corpus) -> None:
    [hit] = corpus.search("malaria bed nets", mode=Mode.HYBRID, k=1).hits
    assert (hit.external_id, hit.title, hit.collection) == ("malaria", "Title malaria", "papers")
    assert hit.text == CORPUS["malaria"][0]
    assert (hit.ordinal, hit.start_char, hit.end_char) == (0, 0, len(hit.text))
    assert hit.document_metadata == {"year": 2016, "source": "arxiv"}
    assert hit.chunk_metadata == {}
    assert hit.collection_id == corpus.papers


@pytest.mark.parametrize("mode", list(Mode))
def test_equal_scores_are_ordered_by_chunk_id(corpus: Corpus, mode: Mode) -> None:
    hits = corpus.search(TWIN, mode=mode, k=2, fusion=Fusion.RRF).hits
    assert {h.external_id for h in hits} == {"twin-1", "twin-2"}
    assert hits[0].chunk_id < hits[1].chunk_id
    if mode is Mode.HYBRID:
        # Each side ranks the twins 1 and 2 by chunk id, so fusion keeps them apart.
        assert hits[0].score == pytest.approx(2 / (RRF_K + 1))
        assert hits[1].score == pytest.approx(2 / (RRF_K + 2))
    else:
        assert hits[0].score == pytest.approx(hits[1].score)


def test_timings_name_each_stage(corpus: Corpus) -> None:
    timings = {m: set(corpus.search("aspirin", mode=m).timings_ms) for m in Mode}
    assert timings[Mode.DENSE] == {"embed", "dense", "total"}
    assert timings[Mode.FULLTEXT] == {"fulltext", "total"}
    assert timings[Mode.HYBRID] == {"embed", "fulltext", "fuse", "total"}


# -- isolation -------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", list(Mode))
def test_other_collections_are_never_returned(corpus: Corpus, mode: Mode) -> None:
    """The other tenant holds the same documents; only the collection passed is searched."""
    result = corpus.search("risk of heart attacks", mode=mode, k=100)
    assert {h.collection_id for h in result.hits} == {corpus.papers}
    both = corpus.search("risk of heart attacks", [corpus.papers, corpus.other], mode=mode, k=100)
    assert {h.collection_id for h in both.hits} == {corpus.papers, corpus.other}


def test_no_collections_means_no_hits(corpus: Corpus) -> None:
    assert corpus.search("aspirin", []).hits == []


ONE_TENANT_SEARCHES: dict[str, dict[str, Any]] = {
    "dense": {"mode": Mode.DENSE},
    "dense filtered": {"mode": Mode.DENSE, "filters": {"source": "pubmed"}},
    "fulltext exact": {"mode": Mode.FULLTEXT},
    "fulltext sql": {"mode": Mode.FULLTEXT, "bm25_exact": False},
    "fulltext filtered": {"mode": Mode.FULLTEXT, "filters": {"year": {"$gte": 2018}}},
    "fulltext feedback": {"mode": Mode.FULLTEXT, "prf": True, "prf_docs": 2},
    "hybrid": {"mode": Mode.HYBRID},
    "hybrid chunk filter": {"mode": Mode.HYBRID, "filters": {"chunk.headings": {"$exists": False}}},
    "hybrid documents": {"mode": Mode.HYBRID, "group_documents": True, "prf": True},
}


@pytest.mark.parametrize("readers", [None, frozenset()], ids=["every document", "restricted"])
@pytest.mark.parametrize("options", ONE_TENANT_SEARCHES.values(), ids=ONE_TENANT_SEARCHES)
def test_one_tenants_search_finds_what_a_search_across_tenants_finds(
    corpus: Corpus, options: dict[str, Any], readers: frozenset[str] | None
) -> None:
    """Run for one tenant, the statements name it (`tenant_id = %(tenant)s`, the joins on
    tenant_id): the same hits, in the same order and with the same scores, as across tenants
    (no document of the corpus is restricted); another tenant's collection finds nothing."""
    query = "risk of heart attacks and lower cholesterol"
    across = corpus.search(query, k=8, **options)
    with tenancy.as_tenant(corpus.runtime.default_tenant_id, readers):
        mine = corpus.search(query, k=8, **options)
        theirs = corpus.search(query, [corpus.other], k=8, **options)
    assert across.hits
    assert [h.chunk_id for h in mine.hits] == [h.chunk_id for h in across.hits]
    # The same scores up to the last bits: a document's score sums its chunks' in the order the
    # plan returns them, which may differ between the two statements.
    assert [h.score for h in mine.hits] == pytest.approx([h.score for h in across.hits], rel=1e-12)
    assert theirs.hits == []


def test_neighbours_for_one_tenant(corpus: Corpus) -> None:
    """The neighbouring chunks' statement names the tenant too: the same chunks either way."""
    [guide] = corpus.search("install", mode=Mode.FULLTEXT, k=1).hits
    across = corpus.searcher.neighbours([guide], 1)
    with tenancy.as_tenant(corpus.runtime.default_tenant_id):
        mine = corpus.searcher.neighbours([guide], 1)
    assert {h.ordinal for h in across} == {guide.ordinal - 1, guide.ordinal + 1} - {-1}
    assert [h.chunk_id for h in mine] == [h.chunk_id for h in across]


# -- HNSW ------------------------------------------------------------------------------------


def bulk_search(
    corpus: Corpus, target: int, *, db: Database | None = None, **options: Any
) -> tuple[SearchResult, str]:
    """Search `bulk` with the vector of document `target` as the query: hits and plan."""
    searcher = Searcher(
        db or corpus.runtime.db,
        lambda _query: corpus.bulk_vectors[target],
        model_id=corpus.bulk_model,
        dimension=BULK_DIMENSION,
    )
    with searcher:
        filters = parse_and_compile(options.pop("filters", None))
        args: dict[str, Any] = {
            "collection_ids": [corpus.bulk],
            "query": "",
            "options": SearchOptions(filters=filters, **options),
        }
        return searcher.search(**args), searcher.explain(**args)


@pytest.mark.parametrize("mode", [Mode.DENSE, Mode.HYBRID])
def test_dense_side_uses_the_models_hnsw_index(corpus: Corpus, mode: Mode) -> None:
    result, plan = bulk_search(corpus, 3, mode=mode, k=10)
    assert f"Index Scan using chunk_embeddings_hnsw_model_{corpus.bulk_model}" in plan
    assert result.hits[0].external_id == "bulk-3"
    assert len(result.hits) == 10


TENANT_OWNED = ("chunks", "chunk_embeddings", "documents", "collections")
_SCAN = re.compile(r"(?:Seq Scan|Index Scan|Index Only Scan|Bitmap Heap Scan).* on (\w+) (\w+)")


def unrestricted_scans(plan: str, tenant: uuid.UUID) -> list[str]:
    """The plan's scans of tenant-owned tables whose conditions do not hold the tenant as a
    constant: what Citus could not route to the tenant's shards. The statements name every
    table they read; an unnamed one (`collections_1`) is the row-level security policy of the
    BM25 postings and statistics looking up their collection (migrations 0007, 0014)."""
    lines = plan.splitlines()
    found = []
    for i, line in enumerate(lines):
        scan = _SCAN.search(line)
        if scan is None or scan.group(1) not in TENANT_OWNED:
            continue
        if re.fullmatch(rf"{scan.group(1)}(_\d+)?", scan.group(2)):
            continue
        conditions = []
        for following in lines[i + 1 :]:
            if "->" in following or not following.strip().startswith(
                ("Filter:", "Index Cond:", "Recheck Cond:", "Order By:")
            ):
                break
            conditions.append(following)
        if f"tenant_id = '{tenant}'::uuid" not in " ".join(conditions):
            found.append(line.strip())
    return found


@pytest.mark.parametrize(
    "options",
    [
        {"mode": Mode.DENSE},
        {"mode": Mode.HYBRID},
        {"mode": Mode.DENSE, "filters": {"group": {"$nin": [1, 2]}}},
        {"mode": Mode.DENSE, "filters": {"chunk.none": {"$exists": False}}},
    ],
    ids=["dense", "hybrid", "document filter", "chunk filter"],
)
def test_one_tenants_dense_search_keeps_the_hnsw_index(
    corpus: Corpus, options: dict[str, Any]
) -> None:
    """For one tenant, the tenant is a filter on the chunks joined to the HNSW index scan (and
    reaches the embeddings through the join on tenant_id): the index is still read, and every
    scan of a tenant-owned table holds the tenant, as a router query needs."""
    tenant = corpus.runtime.default_tenant_id
    across, across_plan = bulk_search(corpus, 3, k=10, **options)
    with tenancy.as_tenant(tenant):
        result, plan = bulk_search(corpus, 3, k=10, **options)
    index = f"Index Scan using chunk_embeddings_hnsw_model_{corpus.bulk_model}"
    assert index in across_plan and index in plan
    assert f"tenant_id = '{tenant}'::uuid" not in across_plan
    assert unrestricted_scans(plan, tenant) == []
    assert [h.chunk_id for h in result.hits] == [h.chunk_id for h in across.hits]
    assert result.hits[0].external_id == "bulk-3"


@pytest.mark.parametrize("exact", [True, False], ids=["exact", "sql"])
def test_one_tenants_full_text_plan_holds_the_tenant(corpus: Corpus, exact: bool) -> None:
    """The full-text statements' scans of chunks, documents and collections hold the tenant
    (the postings and their statistics are read by collection: they have no tenant_id yet)."""
    tenant = corpus.runtime.default_tenant_id
    args: dict[str, Any] = {"collection_ids": [corpus.papers], "query": "heart risk"}
    with tenancy.as_tenant(tenant):
        for options in (
            SearchOptions(mode=Mode.FULLTEXT, bm25_exact=exact),
            SearchOptions(mode=Mode.HYBRID, bm25_exact=exact),
            SearchOptions(mode=Mode.FULLTEXT, filters=parse_and_compile({"year": 2020})),
        ):
            plan = corpus.searcher.explain(**args, options=options)
            assert _SCAN.search(plan)  # the pattern reads this plan
            assert unrestricted_scans(plan, tenant) == []


def test_selective_filter_still_returns_k(corpus: Corpus) -> None:
    """2% of the rows pass, but as `$nin` of the 49 other groups the planner cannot see that
    and walks the HNSW index: the iterative scan must keep going until k rows pass."""
    target = 150  # in group 0
    others = {"group": {"$nin": list(range(1, 50))}}
    result, plan = bulk_search(corpus, target, mode=Mode.DENSE, k=10, ef_search=40, filters=others)
    assert f"Index Scan using chunk_embeddings_hnsw_model_{corpus.bulk_model}" in plan
    assert len(result.hits) == 10
    assert {h.document_metadata["group"] for h in result.hits} == {0}
    assert result.hits[0].external_id == f"bulk-{target}"
    assert all(a.score >= b.score for a, b in zip(result.hits, result.hits[1:], strict=False))
    # Without the iterative scan, the 40 nearest hold too few rows of the group.
    unfiltered, _ = bulk_search(corpus, target, mode=Mode.DENSE, k=40)
    assert sum(h.document_metadata["group"] == 0 for h in unfiltered.hits) < 10


@pytest.mark.parametrize(("storage", "expected"), [("float32", 50), ("binary", 120)])
def test_a_search_runs_with_its_models_storage_ef_search(
    corpus: Corpus, monkeypatch: pytest.MonkeyPatch, storage: str, expected: int
) -> None:
    """No ef_search given: the dense statement runs with the default of the model's storage
    (binary reads its bit index; without it, the same rows in order, only slower)."""
    from ragservice.retrieval.search import FixedModel

    used: list[int | None] = []
    run = Searcher._run

    def spy(self: Searcher, statement: Any, then: Any = None) -> Any:
        used.append(statement.ef_search)
        return run(self, statement, then)

    monkeypatch.setattr(Searcher, "_run", spy)
    model = FixedModel(
        id=corpus.bulk_model,
        dimension=BULK_DIMENSION,
        embed=lambda _query: corpus.bulk_vectors[7],
        storage=storage,
    )
    options = SearchOptions(
        mode=Mode.DENSE, k=10, ef_search_defaults=(("float32", 50), ("binary", 120))
    )
    with Searcher(corpus.runtime.db, models=lambda: model) as searcher:
        hits = searcher.search(collection_ids=[corpus.bulk], query="", options=options).hits
    assert used == [expected]
    assert hits[0].external_id == "bulk-7"


# -- filters ---------------------------------------------------------------------------------

PUBMED = {"aspirin", "statins", "exercise", "coffee", "antibiotics"}
ARXIV_OR_OTHER = {"vitamin", "sleep", "smoking", "malaria", "measles"}

FILTER_CASES: list[tuple[dict[str, Any], set[str]]] = [
    ({"source": "pubmed"}, PUBMED),
    ({"document.source": {"$eq": "pubmed"}}, PUBMED),
    ({"source": {"$ne": "pubmed"}}, ALL - PUBMED),
    ({"year": 2020}, {"aspirin"}),
    ({"year": 2020.0}, {"aspirin"}),
    ({"year": {"$gte": 2020}}, {"aspirin", "vitamin", "coffee", "antibiotics", "gut"}),
    ({"year": {"$gt": 2017, "$lt": 2019}}, {"statins", "zinc"}),
    ({"year": {"$lte": 2000}}, {"twin-1", "twin-2"}),
    ({"year": {"$gte": "2020"}}, {"exercise"}),
    ({"published": {"$lt": "2019"}}, {"statins", "smoking"}),
    ({"published": {"$gte": "2022-05-30"}}, {"coffee", "antibiotics"}),
    ({"published": {"$gt": "2015-12-31T12:00:00", "$lt": "2018"}}, {"smoking"}),
    ({"source": {"$in": ["arxiv", "other"]}}, ARXIV_OR_OTHER),
    ({"source": {"$nin": ["arxiv", "other"]}}, ALL - ARXIV_OR_OTHER),
    ({"year": {"$in": [2014, "2020", 1999]}}, {"measles", "exercise"}),
    ({"year": {"$in": []}}, set()),
    ({"tags": ["cardio"]}, {"statins"}),
    ({"tags": {"$ne": ["cardio"]}}, ALL - {"statins"}),
    ({"tags": {"$exists": True}}, {"aspirin", "statins", "zinc"}),
    ({"flag": None}, {"coffee"}),
    ({"flag": {"$exists": False}}, ALL - {"coffee"}),
    ({"source": "pubmed", "year": {"$lt": 2020}}, {"statins"}),
    ({"chunk.headings": {"$exists": True}}, {"guide"}),
    ({"chunk.headings": {"$exists": True}, "source": "pubmed"}, set()),
]


def case_id(value: object) -> str:
    """A test id the same in every process: a set's order varies with the hash seed, and
    pytest-xdist's workers must collect the same ids."""
    return str(sorted(value)) if isinstance(value, set) else str(value)


@pytest.mark.parametrize("mode", [Mode.DENSE, Mode.HYBRID])
@pytest.mark.parametrize(("raw", "expected"), FILTER_CASES, ids=case_id)
def test_filters_select_exactly_the_matching_documents(
    corpus: Corpus, raw: dict[str, Any], expected: set[str], mode: Mode
) -> None:
    result = corpus.search("health research", mode=mode, k=100, filters=raw)
    assert set(ids(result)) == expected


def test_chunk_filter_selects_single_chunks(corpus: Corpus) -> None:
    result = corpus.search(
        "installing", mode=Mode.DENSE, filters={"chunk.headings": ["Guide", "Install"]}
    )
    assert [(h.external_id, h.ordinal) for h in result.hits] == [("guide", 1)]
    assert result.hits[0].text.startswith("## Install")


def test_fulltext_filters_apply_before_the_limit(corpus: Corpus) -> None:
    # Unfiltered, "sleep" is not the best match for "risk"; filtered it must still come back.
    unfiltered = corpus.search("risk", mode=Mode.FULLTEXT, k=1)
    assert ids(unfiltered) != ["sleep"]
    assert ids(corpus.search("risk", mode=Mode.FULLTEXT, k=1, filters={"source": "arxiv"})) == [
        "sleep"
    ]
    assert ids(corpus.search("risk", mode=Mode.FULLTEXT, filters={"year": {"$gt": 3000}})) == []


# -- postings kept by the triggers -----------------------------------------------------------


# `OFFSET 0`: the tsvector and its length computed once a chunk, not once a lexeme.
_LEXEMES = (
    "SELECT c.collection_id, c.seq, t.lexeme, coalesce(array_length(t.positions, 1), 1) AS tf, "
    "v.len FROM chunks c "
    "CROSS JOIN LATERAL (SELECT w.tsv, ragservice_tsv_length(w.tsv) FROM "
    "(SELECT to_tsvector('english', c.text) OFFSET 0) AS w(tsv) OFFSET 0) AS v(tsv, len) "
    "CROSS JOIN LATERAL unnest(v.tsv) AS t"
)


def postings_mismatches(runtime: Runtime) -> list[Any]:
    """Postings, blocks or collection_text_stats rows that the chunks themselves do not imply."""
    with runtime.db.read() as session:
        expected_terms = (
            "SELECT collection_id, lexeme, ragservice_bm25_tier(tf, len), seq, tf, len "
            f"FROM ({_LEXEMES}) AS x"
        )
        actual_terms = (
            "SELECT p.collection_id, p.lexeme, p.tier, u.seq, u.tf, u.len FROM chunk_postings p "
            "CROSS JOIN LATERAL unnest(p.seqs, p.tfs, p.lengths) AS u(seq, tf, len)"
        )
        expected_stats = (  # every chunk counts, one without lexemes too (length 0)
            "SELECT collection_id, count(*), "
            "sum(ragservice_tsv_length(to_tsvector('english', text))) FROM chunks "
            "GROUP BY collection_id"
        )
        actual_stats = (  # a collection's rows (one per writing backend) add up
            "SELECT collection_id, sum(chunk_count), sum(token_count) FROM collection_text_stats "
            "GROUP BY collection_id HAVING sum(chunk_count) > 0"
        )
        rows: list[Any] = []
        for left, right in ((expected_terms, actual_terms), (expected_stats, actual_stats)):
            rows += session.execute(
                text(f"({left} EXCEPT ALL {right}) UNION ALL ({right} EXCEPT ALL {left})")
            ).all()
        # Each block: non-empty, at most 128 postings, its bounds and count true to its arrays.
        rows += session.execute(
            text(
                "SELECT * FROM chunk_postings WHERE n <> cardinality(seqs) OR n < 1 OR n > 128 "
                "OR cardinality(tfs) <> n OR cardinality(lengths) <> n "
                "OR first_seq <> (SELECT min(s) FROM unnest(seqs) s) "
                "OR last_seq <> (SELECT max(s) FROM unnest(seqs) s) "
                "OR max_tf <> (SELECT max(t) FROM unnest(tfs) t) "
                "OR min_len <> (SELECT min(x) FROM unnest(lengths) x)"
            )
        ).all()
    return rows


def test_postings_follow_replaced_and_deleted_documents(
    runtime: Runtime, embedder: SentenceTransformerEmbedder
) -> None:
    caching = CachingEmbedder(embedder)
    docs = [d for d in DOCS if d.external_id in {"aspirin", "statins", "smoking", "coffee"}]
    ingest(runtime, caching, docs, collection="papers")
    papers = collection_id(runtime, "papers")
    changed = loaded("aspirin", "Zebrafish embryos regrow heart tissue after injury.", {})
    ingest(runtime, caching, [changed, *docs[1:]], collection="papers")
    with runtime.db.write() as session:
        assert store.documents.delete_documents(session, papers, ["smoking"]) == 1

    assert postings_mismatches(runtime) == []
    with make_searcher(runtime, caching) as searcher:

        def fulltext(query: str) -> list[SearchHit]:
            options = SearchOptions(mode=Mode.FULLTEXT, k=50)
            return searcher.search(collection_ids=[papers], query=query, options=options).hits

        assert [h.external_id for h in fulltext("zebrafish")] == ["aspirin"]
        assert fulltext("platelets") == []
        assert fulltext("cancer") == []
        query = "heart risk of lower cholesterol"
        assert_matches_reference(
            fulltext(query), reference_bm25(runtime, papers, query, k1=0.9, b=0.4)
        )


def test_feedback_expands_full_text_and_documents_group_chunks(corpus: Corpus) -> None:
    """RM3 in SQL: "platelets" is in the aspirin abstract alone; its other words (risk, heart)
    bring in the abstracts that share them, after it, and filters bound both passes. Grouped
    by document, each document comes once, however many of its chunks match."""

    def ids(**options: Any) -> list[str]:
        return [
            h.external_id for h in corpus.search("platelets", mode=Mode.FULLTEXT, **options).hits
        ]

    assert ids(k=5) == ["aspirin"]
    expanded = ids(k=5, prf=True, prf_docs=1, prf_terms=8)
    assert expanded[0] == "aspirin" and {"sleep", "coffee"} <= set(expanded)
    pubmed = ids(k=5, prf=True, prf_docs=1, prf_terms=8, filters={"source": "pubmed"})
    assert pubmed[0] == "aspirin" and "coffee" in pubmed and "sleep" not in pubmed
    for mode in Mode:
        chunks = corpus.search("guide install use questions", mode=mode, k=20).hits
        grouped = corpus.search(
            "guide install use questions", mode=mode, k=20, group_documents=True
        ).hits
        assert sum(h.external_id == "guide" for h in chunks) > 1
        assert [h.external_id for h in grouped].count("guide") == 1
        assert len({h.document_id for h in grouped}) == len(grouped)
