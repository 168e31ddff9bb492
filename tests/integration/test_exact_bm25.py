"""Exact BM25 with block-max pruning (the `ragservice_bm25` extension, migration 0023): its top k
equals exhaustive BM25 computed in Python for random queries, weights, k, k1 and b over a corpus
of very frequent terms; it skips blocks when it can; it reads as its caller (row-level
security); and the searcher uses it for unfiltered full text."""

from __future__ import annotations

import math
import random
import uuid
from collections import Counter
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError

from ragservice import store
from ragservice.db import tenancy
from ragservice.retrieval import statements
from ragservice.retrieval.search import Mode, Searcher, SearchOptions
from ragservice.runtime import Runtime
from ragservice.services.search import open_searcher
from tests.integration.test_postings import document_of, write

# A Zipf vocabulary: the first words are in most chunks (very frequent terms, low idf), the
# last in a handful.
VOCABULARY = [f"{stem}{suffix}" for suffix in ("", "ic", "ate") for stem in (
    "protein", "membrane", "cell", "gene", "tissue", "sample", "signal", "enzyme", "neuron",
    "plasma", "cortex", "kinase", "ligand", "vector", "strain", "serum", "lesion", "muscle",
    "glucose", "insulin",
)]  # fmt: skip
# ... and rare words, each in a handful of chunks.
RARE = [f"rare{letter}" for letter in "abcdefghij"]
CHUNKS = 6_000

_TOPK = (
    "SELECT seq, score FROM ragservice_bm25_topk(CAST(:c AS uuid[]), CAST(:terms AS text[]), "
    "CAST(:weights AS float8[]), :k, :k1, :b)"
)


def zipf_text(rng: random.Random) -> str:
    words = rng.choices(VOCABULARY, weights=[1 / (r + 1) for r in range(len(VOCABULARY))], k=20)
    words = words[: rng.randint(3, 20)]
    if rng.random() < 0.005:
        words.append(rng.choice(RARE))
    return " ".join(words) + "."


def fill_frequent(runtime: Runtime) -> uuid.UUID:
    """CHUNKS chunks of 3-20 Zipf-drawn words, in one bulk statement."""
    rng = random.Random(29)
    docs = [
        document_of(f"doc-{d}", [zipf_text(rng) for _ in range(100)]) for d in range(CHUNKS // 100)
    ]
    return write(runtime, "frequent", docs)


def lexemes_of(runtime: Runtime, query: str) -> list[str]:
    with runtime.db.read() as session:
        return list(
            session.execute(
                text("SELECT tsvector_to_array(to_tsvector('english', :q))"), {"q": query}
            ).scalar_one()
        )


@dataclass(frozen=True)
class Reference:
    """Every chunk's lexemes with their tf, and its length, read once from its tsvector."""

    tf: dict[int, dict[str, int]]
    lengths: dict[int, int]

    @classmethod
    def load(cls, runtime: Runtime, collection: uuid.UUID) -> Reference:
        with runtime.db.read() as session:
            rows = session.execute(
                text(
                    "SELECT c.seq, t.lexeme, coalesce(array_length(t.positions, 1), 1) "
                    "FROM chunks c CROSS JOIN LATERAL unnest(to_tsvector('english', c.text)) t "
                    "WHERE c.collection_id = :c"
                ),
                {"c": collection},
            ).all()
        tf: dict[int, dict[str, int]] = {}
        for seq, lexeme, count in rows:
            tf.setdefault(seq, {})[lexeme] = count
        return cls(tf, {seq: sum(terms.values()) for seq, terms in tf.items()})

    def scores(self, weights: dict[str, float], k1: float, b: float) -> dict[int, float]:
        n = len(self.tf)
        avgdl = sum(self.lengths.values()) / n
        df = Counter(t for terms in self.tf.values() for t in terms if t in weights)
        scores: dict[int, float] = {}
        for seq, terms in self.tf.items():
            matched = [t for t in terms if t in weights]
            if matched:
                scores[seq] = sum(
                    weights[t]
                    * math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5))
                    * terms[t]
                    * (k1 + 1)
                    / (terms[t] + k1 * (1 - b + b * self.lengths[seq] / avgdl))
                    for t in matched
                )
        return scores


def assert_exact_top_k(found: dict[int, float], expected: dict[int, float], k: int) -> None:
    """`found` holds BM25's top k with their exact scores: every chunk scoring above the k-th
    best score, and chunks tying with it (those at the cut may be any of the ties)."""
    ranked = sorted(expected.values(), reverse=True)
    if not ranked:
        assert found == {}
        return
    cut = ranked[min(k, len(ranked)) - 1]
    tolerance = 1e-9 * max(1.0, abs(cut))
    assert len(found) >= min(k, len(ranked))
    for seq, score in found.items():
        assert score == pytest.approx(expected[seq], rel=1e-9)
        assert score >= cut - tolerance
    above = {seq for seq, score in expected.items() if score > cut + tolerance}
    assert above <= set(found)


def top_k(
    runtime: Runtime,
    collection: uuid.UUID,
    terms: list[str],
    weights: list[float] | None,
    k: int,
    k1: float = 1.2,
    b: float = 0.75,
    accumulator: str = "auto",
    exhaustive_min_postings: int = 65536,
) -> tuple[dict[int, float], tuple[int, int]]:
    """The function's rows, and the blocks it read of those in the terms' lists
    (`accumulator`, `exhaustive_min_postings`: the extension's settings for the call)."""
    with runtime.db.read() as session:
        session.execute(
            text(
                "SELECT set_config('ragservice_bm25.accumulator', :a, true), "
                "set_config('ragservice_bm25.exhaustive_min_postings', :m, true)"
            ),
            {"a": accumulator, "m": str(exhaustive_min_postings)},
        )
        params = {"c": [collection], "terms": terms, "weights": weights, "k": k, "k1": k1, "b": b}
        rows = session.execute(text(_TOPK), params).all()
        stats = session.execute(
            text("SELECT blocks, blocks_read FROM ragservice_bm25_last_stats()")
        ).one()
    return {int(seq): float(score) for seq, score in rows}, (stats[0], stats[1])


@pytest.fixture
def frequent(runtime: Runtime) -> tuple[uuid.UUID, Reference]:
    collection = fill_frequent(runtime)
    return collection, Reference.load(runtime, collection)


def test_the_migration_installs_the_extension(runtime: Runtime) -> None:
    with runtime.db.read() as session:
        installed = session.execute(
            text("SELECT extversion FROM pg_extension WHERE extname = 'ragservice_bm25'")
        ).scalar()
    assert installed == "1.2"


# The ways the function may go: partial scores in a hash or in an array over the seq range,
# and (exhaustive_min_postings 0) giving up the pruning for the exhaustive scan whenever a 128th
# of the postings is read without finishing.
PATHS = [("hash", 65536), ("array", 65536), ("array", 0)]


@pytest.mark.parametrize(("accumulator", "exhaustive_min_postings"), PATHS)
def test_top_k_equals_exhaustive_bm25_for_random_queries(
    runtime: Runtime,
    frequent: tuple[uuid.UUID, Reference],
    accumulator: str,
    exhaustive_min_postings: int,
) -> None:
    collection, reference = frequent
    lexemes = sorted({t for terms in reference.tf.values() for t in terms})

    @settings(max_examples=60, deadline=None, derandomize=True)
    @given(
        terms=st.lists(st.sampled_from([*lexemes, "absent"]), min_size=1, max_size=8),
        weighted=st.booleans(),
        seed=st.integers(0, 2**16),
        k=st.integers(1, 60),
        k1=st.floats(0, 3),
        b=st.floats(0, 1),
    )
    def check(terms: list[str], weighted: bool, seed: int, k: int, k1: float, b: float) -> None:
        rng = random.Random(seed)
        weights = [round(rng.uniform(0.05, 2), 3) for _ in terms] if weighted else None
        merged: dict[str, float] = {}
        for i, term in enumerate(terms):  # a repeated term's weights add up
            merged[term] = merged.get(term, 0.0) + (weights[i] if weights else 1.0)
        if not weighted:
            merged = dict.fromkeys(merged, 1.0)
            terms = list(merged)
        found, _ = top_k(
            runtime, collection, terms, weights, k, k1, b, accumulator, exhaustive_min_postings
        )
        assert_exact_top_k(found, reference.scores(merged, k1, b), k)

    check()


@pytest.mark.parametrize(("accumulator", "exhaustive_min_postings"), PATHS)
def test_a_query_of_more_terms_than_the_seen_bits_is_still_exact(
    runtime: Runtime,
    frequent: tuple[uuid.UUID, Reference],
    accumulator: str,
    exhaustive_min_postings: int,
) -> None:
    """A chunk remembers which of the first 32 terms it was seen in; the others always count
    as unseen (their bound is added), which prunes less but never wrongly."""
    collection, reference = frequent
    lexemes = sorted({t for terms in reference.tf.values() for t in terms})
    assert len(lexemes) > 40
    rng = random.Random(3)
    for k in (1, 10, 50):
        terms = rng.sample(lexemes, 40)
        weights = [round(rng.uniform(0.05, 2), 3) for _ in terms]
        found, (blocks, read) = top_k(
            runtime, collection, terms, weights, k, 0.9, 0.4, accumulator, exhaustive_min_postings
        )
        expected = reference.scores(dict(zip(terms, weights, strict=True)), 0.9, 0.4)
        assert_exact_top_k(found, expected, k)
        # each block once, or (giving up) once more by the exhaustive scan
        assert read <= (blocks if exhaustive_min_postings else 2 * blocks)


def test_the_accumulator_setting_refuses_an_unknown_value(runtime: Runtime) -> None:
    with runtime.db.read() as session:
        session.execute(text("SELECT ragservice_bm25_last_stats()"))  # loads the library
        with pytest.raises(DBAPIError, match="invalid value"):
            session.execute(text("SET ragservice_bm25.accumulator = 'vector'"))


def test_blocks_that_cannot_reach_the_top_k_are_skipped(
    runtime: Runtime, frequent: tuple[uuid.UUID, Reference]
) -> None:
    collection, reference = frequent
    df = Counter(t for terms in reference.tf.values() for t in terms)
    ranked = [t for t, _ in df.most_common()]
    terms = [*ranked[:3], "rarea", "rareb"]  # three very frequent terms, two rare ones
    found, (blocks, read) = top_k(runtime, collection, terms, None, 3)
    assert_exact_top_k(found, reference.scores(dict.fromkeys(terms, 1.0), 1.2, 0.75), 3)
    assert blocks > 100
    assert read < blocks / 2
    # Asked for every chunk, it reads every block.
    _, (blocks, read) = top_k(runtime, collection, terms, None, CHUNKS)
    assert read == blocks


def test_a_query_the_bounds_cannot_prune_is_scored_in_one_scan(
    runtime: Runtime, frequent: tuple[uuid.UUID, Reference]
) -> None:
    """Asked for every chunk, the pruning has read a 128th of the postings without finishing and
    gives up: the exhaustive scan reads every block once more. With a negative weight the
    bounds do not hold and the scan is all it reads. The ranking is exhaustive BM25's."""
    collection, reference = frequent
    df = Counter(t for terms in reference.tf.values() for t in terms)
    terms = [t for t, _ in df.most_common(4)]
    found, (blocks, read) = top_k(runtime, collection, terms, None, CHUNKS, 1.2, 0.75, "auto", 0)
    assert_exact_top_k(found, reference.scores(dict.fromkeys(terms, 1.0), 1.2, 0.75), CHUNKS)
    assert blocks < read <= 2 * blocks
    weights = [1.0, -0.5, 2.0, 1.0]
    found, (blocks, read) = top_k(runtime, collection, terms, weights, 10, 0.9, 0.4, "array")
    expected = reference.scores(dict(zip(terms, weights, strict=True)), 0.9, 0.4)
    assert_exact_top_k(found, expected, 10)
    assert read == blocks


def test_it_reads_as_its_caller_so_another_tenant_finds_nothing(
    runtime: Runtime, frequent: tuple[uuid.UUID, Reference]
) -> None:
    collection, _ = frequent
    with tenancy.as_system(), runtime.db.write() as session:
        other = store.tenants.ensure_tenant(session, "other-bm25")
    with tenancy.as_tenant(other):
        found, (blocks, _) = top_k(runtime, collection, ["protein", "cell"], None, 10)
    assert found == {} and blocks == 0
    found, _ = top_k(runtime, collection, ["protein", "cell"], None, 10)
    assert len(found) >= 10


_TOPK_IN = (
    "SELECT seq, score FROM ragservice_bm25_topk_in(CAST(:postings AS regclass), "
    "CAST(:totals AS regclass), CAST(:c AS uuid[]), CAST(:terms AS text[]), NULL, :k, 1.2, 0.75)"
)


def test_over_given_tables_it_reads_those_tables_and_no_others(
    runtime: Runtime, frequent: tuple[uuid.UUID, Reference]
) -> None:
    """The form a store distributed on Citus runs on a worker, over the shards of the asker's
    tenant: here over the tables themselves, the same rows; any other table is refused."""
    collection, _ = frequent
    terms = ["protein", "cell", "rarea"]
    expected, _ = top_k(runtime, collection, terms, None, 10)
    params = {"c": [collection], "terms": terms, "k": 10}
    tables = {"postings": "public.chunk_postings", "totals": "public.collection_text_stats"}
    with runtime.db.read() as session:
        rows = session.execute(text(_TOPK_IN), params | tables).all()
    assert {int(seq): float(score) for seq, score in rows} == expected
    for wrong in (
        {"postings": "public.chunks"},
        {"totals": "public.chunk_postings"},
        {"postings": "pg_catalog.pg_class"},
    ):
        with (
            pytest.raises(
                DBAPIError, match=r"reads public\.(chunk_postings|collection_text_stats)"
            ),
            runtime.db.read() as session,
        ):
            session.execute(text(_TOPK_IN), params | tables | wrong)


def test_the_searcher_uses_it_for_unfiltered_full_text(
    runtime: Runtime, frequent: tuple[uuid.UUID, Reference]
) -> None:
    collection, reference = frequent
    query = "protein membrane cells insulinate"
    options = SearchOptions(mode=Mode.FULLTEXT, k=10, bm25_postings_per_term=50)

    def search(exact: bool | None) -> list[tuple[uuid.UUID, float]]:
        searcher = Searcher(
            runtime.db, lambda _: np.zeros(4, np.float32), model_id=0, dimension=4,
            exact_bm25=exact,
        )  # fmt: skip
        with searcher as s:
            hits = s.search(collection_ids=[collection], query=query, options=options).hits
        return [(h.chunk_id, h.score) for h in hits]

    with runtime.db.read() as session:
        seqs = dict(
            session.execute(
                text("SELECT id, seq FROM chunks WHERE collection_id = :c"), {"c": collection}
            ).all()
        )
    exact = search(None)
    weights = dict.fromkeys(lexemes_of(runtime, query), 1.0)
    expected = reference.scores(weights, options.bm25_k1, options.bm25_b)
    assert_exact_top_k({seqs[c]: score for c, score in exact}, expected, 10)
    # The budgeted statement reads 50 postings a term: not the same ranking here.
    budgeted = search(False)
    assert budgeted != exact
    # RAGSERVICE_BM25_EXACT=false: the service's searches take the budgeted statement.
    settings = runtime.settings.model_copy(update={"bm25_exact": False})
    resolved = SearchOptions.from_settings(
        settings.search, mode=Mode.FULLTEXT, k=10, bm25_postings_per_term=50
    )
    with open_searcher(runtime.db, runtime.models) as s:
        hits = s.search(collection_ids=[collection], query=query, options=resolved).hits
    assert [(h.chunk_id, h.score) for h in hits] == budgeted


def test_without_the_extension_full_text_falls_back_to_the_sql_statement(
    runtime: Runtime, frequent: tuple[uuid.UUID, Reference], database_url: str
) -> None:
    """A database without the extension (dropped, as migration 0023's downgrade does, as on a
    server without its files): the searcher notices and ranks by the budgeted SQL statement;
    made again, the extension gives exact search back."""
    collection, _ = frequent
    options = SearchOptions(mode=Mode.FULLTEXT, k=10, bm25_postings_per_term=10**6)

    def search() -> list[tuple[uuid.UUID, float]]:
        searcher = Searcher(runtime.db, lambda _: np.zeros(4, np.float32), model_id=0, dimension=4)
        with searcher as s:
            hits = s.search(collection_ids=[collection], query="protein cells", options=options)
        return [(h.chunk_id, h.score) for h in hits.hits]

    def installed() -> bool:
        with runtime.db.read() as session:
            return bool(session.execute(text(statements.HAS_EXACT_BM25.as_string())).scalar())

    exact = search()
    engine = create_engine(database_url)
    try:
        with engine.begin() as conn:
            conn.execute(text("DROP EXTENSION ragservice_bm25"))
        runtime.db.dispose()
        assert not installed()
        fallback = search()  # an unlimited budget: every posting, the same ranking
        assert [c for c, _ in fallback] == [c for c, _ in exact]
        assert [s for _, s in fallback] == pytest.approx([s for _, s in exact], rel=1e-9)
        with engine.begin() as conn:
            conn.execute(text("CREATE EXTENSION ragservice_bm25 SCHEMA public"))
    finally:
        engine.dispose()
    runtime.db.dispose()
    assert installed()
    assert search() == exact
