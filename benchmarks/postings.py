"""BM25 postings at scale: the one-row-per-posting design (migration 0013) against the blocks
of migration 0014, on the same synthetic chunks, in two scratch databases.

    python benchmarks/postings.py --chunks 100000 [--batch 5000] [--data ../shared/data/scifact]

Chunks are sampled from SciFact's own word frequencies (a Zipf vocabulary of real words, so
SciFact's queries find postings), 60-220 words each. They go in through the triggers, `--batch`
chunks per INSERT (the bulk-import path). Reported per design: load rate, postings bytes per
chunk (tables, TOAST, indexes; for 0013 with the `chunks.tsv` GIN index, which 0014 drops), and
fulltext p50 / p95 in SQL (k = 10, candidate ids only) for 50 SciFact queries and for 50
queries of 3-5 of the 30 most frequent lexemes; for 0014 at several posting budgets too.
Final line: JSON.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

import numpy as np  # noqa: E402
import psycopg  # noqa: E402
from psycopg import sql  # noqa: E402
from sqlalchemy import create_engine  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

from ragservice.db import migrate  # noqa: E402
from ragservice.db.embedded import embedded_database_url  # noqa: E402
from ragservice.retrieval import statements  # noqa: E402

# The BM25 statement of migration 0013's schema, as `statements.BM25` was then.
OLD_BM25 = """
WITH stats AS (
    SELECT sum(chunk_count)::float8 AS n,
           sum(token_count)::float8 / greatest(sum(chunk_count), 1) AS avgdl
    FROM collection_text_stats WHERE collection_id = ANY(%(collections)s::uuid[])
),
postings AS MATERIALIZED (
    SELECT t.lexeme, t.chunk_id, t.tf, t.chunk_length FROM chunk_terms t
    WHERE t.collection_id = ANY(%(collections)s::uuid[])
      AND t.lexeme = ANY(tsvector_to_array(to_tsvector('english'::regconfig, %(query)s)))
),
idf AS (
    SELECT p.lexeme, ln(1 + (s.n - count(*) + 0.5) / (count(*) + 0.5)) AS idf
    FROM postings p CROSS JOIN stats s GROUP BY p.lexeme, s.n
),
bm25 AS (
    SELECT p.chunk_id, sum(i.idf * p.tf * (%(k1)s + 1)
               / (p.tf + %(k1)s * (1 - %(b)s + %(b)s * p.chunk_length / s.avgdl))) AS score
    FROM postings p JOIN idf i USING (lexeme) CROSS JOIN stats s GROUP BY p.chunk_id
)
SELECT chunk_id FROM bm25 ORDER BY score DESC, chunk_id LIMIT 10
"""

NEW_BM25 = statements.with_ctes(
    statements.bm25(None, 10),
    select=statements.TEXT_CANDIDATES,
)


def vocabulary(data: Path) -> tuple[list[str], np.ndarray]:
    counts: Counter[str] = Counter()
    with (data / "corpus.jsonl").open() as lines:
        for line in lines:
            doc = json.loads(line)
            counts.update(re.findall(r"[a-z]+", (doc["title"] + " " + doc["text"]).lower()))
    words, freq = zip(*counts.most_common(), strict=True)
    p = np.asarray(freq, dtype=np.float64)
    return list(words), p / p.sum()


def texts(n: int, words: list[str], p: np.ndarray, seed: int = 7) -> list[str]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(60, 221, size=n)
    drawn = rng.choice(len(words), size=int(lengths.sum()), p=p)
    out, at = [], 0
    for length in lengths:
        out.append(" ".join(words[i] for i in drawn[at : at + length]))
        at += length
    return out


def scratch(admin: str, name: str, revision: str) -> str:
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = make_url(admin).set(database=name)
    engine = create_engine(url.set(drivername="postgresql+psycopg"))
    try:
        from alembic import command

        config = migrate.alembic_config()
        with engine.connect() as conn:
            config.attributes["connection"] = conn
            command.upgrade(config, revision)
            conn.commit()
    finally:
        engine.dispose()
    return url.render_as_string(hide_password=False)


def load(url: str, bodies: list[str], batch: int) -> tuple[uuid.UUID, float]:
    """The chunks through the triggers, `batch` per INSERT; returns the collection, seconds."""
    with psycopg.connect(url, autocommit=True) as conn:
        tenant = conn.execute("SELECT id FROM tenants LIMIT 1").fetchone()[0]  # type: ignore[index]
        collection = conn.execute(
            "INSERT INTO collections (tenant_id, name) VALUES (%s, 'scale') RETURNING id",
            (tenant,),
        ).fetchone()[0]  # type: ignore[index]
        document = conn.execute(
            "INSERT INTO documents (tenant_id, collection_id, external_id, content_hash, "
            "chunk_count, char_count) VALUES (%s, %s, 'd', 'h', 0, 0) RETURNING id",
            (tenant, collection),
        ).fetchone()[0]  # type: ignore[index]
        conn.execute("CREATE UNLOGGED TABLE staging (i int, body text)")
        with conn.cursor().copy("COPY staging FROM STDIN") as copy:
            for i, body in enumerate(bodies):
                copy.write_row((i, body))
        started = time.perf_counter()
        for lo in range(0, len(bodies), batch):
            conn.execute(
                "INSERT INTO chunks (id, tenant_id, collection_id, document_id, ordinal, text, "
                "token_count, content_hash, start_char, end_char) "
                "SELECT gen_random_uuid(), %s, %s, %s, i, body, 0, md5(body), 0, length(body) "
                "FROM staging WHERE i >= %s AND i < %s",
                (tenant, collection, document, lo, lo + batch),
            )
        seconds = time.perf_counter() - started
        conn.execute("DROP TABLE staging")
        conn.execute("VACUUM ANALYZE")
    return collection, seconds


def size(url: str, relations: list[str]) -> int:
    with psycopg.connect(url) as conn:
        return sum(
            conn.execute("SELECT pg_total_relation_size(%s::regclass)", (r,)).fetchone()[0]  # type: ignore[index]
            for r in relations
        )


def latency(url: str, query: Any, params: dict[str, Any], texts_: list[str]) -> dict[str, float]:
    with psycopg.connect(url) as conn:
        for q in texts_[:5]:  # warm the cache
            conn.execute(query, {**params, "query": q}, prepare=False).fetchall()
        ms = []
        for q in texts_:
            started = time.perf_counter()
            conn.execute(query, {**params, "query": q}, prepare=False).fetchall()
            ms.append((time.perf_counter() - started) * 1000)
    return {"p50": round(statistics.median(ms), 1), "p95": round(float(np.percentile(ms, 95)), 1)}


def frequent_queries(url: str, rng: np.random.Generator) -> list[str]:
    with psycopg.connect(url) as conn:
        top = [
            row[0]
            for row in conn.execute(
                "SELECT lexeme FROM chunk_postings GROUP BY lexeme ORDER BY sum(n) DESC LIMIT 30"
            )
        ]
    return [" ".join(rng.choice(top, size=rng.integers(3, 6), replace=False)) for _ in range(50)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--chunks", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=5_000)
    parser.add_argument("--data", type=Path, default=Path("/work/shared/data/scifact"))
    parser.add_argument("--budgets", default="2000,5000,10000,20000")
    parser.add_argument("--new-only", action="store_true", help="skip the 0013 design")
    args = parser.parse_args()

    words, p = vocabulary(args.data)
    bodies = texts(args.chunks, words, p)
    rng = np.random.default_rng(11)
    scifact = [json.loads(line)["text"] for line in (args.data / "queries.jsonl").open()]
    scifact = [str(q) for q in rng.choice(scifact, size=50, replace=False)]
    admin = make_url(embedded_database_url(Path(tempfile.mkdtemp(prefix="postings-pg-"))))
    admin_url = admin.set(drivername="postgresql").render_as_string(hide_password=False)

    new = scratch(admin_url, "postings_new", "head")
    collection, new_s = load(new, bodies, args.batch)
    frequent = frequent_queries(new, rng)
    base = {"collections": [collection], "k1": 0.9, "b": 0.4}
    result: dict[str, Any] = {"chunks": args.chunks, "batch": args.batch}
    result["new"] = {
        "load_chunks_per_s": round(args.chunks / new_s),
        "postings_bytes_per_chunk": round(
            size(new, ["chunk_postings", "chunks_seq_key"]) / args.chunks
        ),
        "scifact": {},
        "frequent": {},
    }
    for budget in map(int, args.budgets.split(",")):
        params = {**base, "budget": budget}
        result["new"]["scifact"][budget] = latency(new, NEW_BM25, params, scifact)
        result["new"]["frequent"][budget] = latency(new, NEW_BM25, params, frequent)
    print(json.dumps(result), flush=True)
    if args.new_only:
        return

    old = scratch(admin_url, "postings_old", "0013")
    collection, old_s = load(old, bodies, args.batch)
    base["collections"] = [collection]
    result["old"] = {
        "load_chunks_per_s": round(args.chunks / old_s),
        "postings_bytes_per_chunk": round(
            size(old, ["chunk_terms", "chunks_tsv_idx"]) / args.chunks
        ),
        "scifact": latency(old, OLD_BM25, base, scifact),
        "frequent": latency(old, OLD_BM25, base, frequent),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
