"""Peak memory of one exact-BM25 call (`ragservice_bm25_topk`) by `work_mem`, on synthetic
postings written straight into `chunk_postings` (no text, no model: a million chunks build in
seconds).

Eight terms occur in one chunk of 2, 3, 5, 7, 11, 100, 1,000 and 5,000; three queries (frequent,
mixed, rare) run at each `work_mem`, each on a fresh backend whose private resident memory
(`RssAnon`) is polled every 0.5 ms while the call runs: the figure is its peak above the level
before the call.

    .venv/bin/python benchmarks/bm25_memory.py --chunks 1000000

Prints a line per (work_mem, query) and a final JSON line:
`{"chunks": …, "blocks": …, "postings": …, "peaks_mb": {"1MB": {"frequent": …}, …},
"worst_ratio": …}` where `worst_ratio` is the largest peak / work_mem.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row
from sqlalchemy.engine import make_url

from ragservice.db.embedded import embedded_database_url

COLLECTION = uuid.UUID("00000000-0000-0000-0000-0000000000c1")
TERMS = {"t2": 2, "t3": 3, "t5": 5, "t7": 7, "t11": 11, "t100": 100, "t1000": 1000, "t5000": 5000}
QUERIES = {
    "frequent": ["t2", "t3", "t5", "t7", "t11"],
    "mixed": ["t2", "t100", "t1000", "t5000"],
    "rare": ["t1000", "t5000"],
}
WORK_MEMS = {"1MB": 1, "4MB": 4, "16MB": 16, "64MB": 64}
BLOCK = 128  # postings per block, as the store packs them

_POSTINGS = """
CREATE TABLE chunk_postings (
    collection_id uuid, lexeme text COLLATE "C", tier smallint, first_seq bigint,
    last_seq bigint, n integer, seqs bigint[], tfs smallint[], lengths integer[],
    max_tf smallint, min_len integer,
    PRIMARY KEY (collection_id, lexeme, tier, first_seq) INCLUDE (last_seq, n))
"""
_STATS = (
    "CREATE TABLE collection_text_stats "
    "(collection_id uuid, slot int, chunk_count bigint, token_count bigint)"
)
_BLOCKS = """
INSERT INTO chunk_postings
SELECT %(c)s, %(l)s, p.tier, min(p.seq), max(p.seq), count(*), array_agg(p.seq ORDER BY p.seq),
       array_agg(p.tf ORDER BY p.seq), array_agg(p.len ORDER BY p.seq), max(p.tf), min(p.len)
FROM (SELECT i::int8 AS seq, (1 + (i * 7919) %% 6)::int2 AS tf,
             (20 + (i * 104729) %% 80)::int4 AS len, ((i * 31) %% 4)::int2 AS tier,
             row_number() OVER (PARTITION BY (i * 31) %% 4 ORDER BY i) AS r
      FROM generate_series(0::int8, %(n)s - 1) AS i WHERE (i * 2654435761) %% %(e)s = 0) AS p
GROUP BY p.tier, (p.r - 1) / %(b)s
"""


def _status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise LookupError(field)


class AnonPeak(threading.Thread):
    """A backend's private resident memory, polled every 0.5 ms until `done`: its peak (kB)."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak = _status_kb(pid, "RssAnon")
        self.done = False

    def run(self) -> None:
        while not self.done:
            self.peak = max(self.peak, _status_kb(self.pid, "RssAnon"))
            time.sleep(0.0005)


def build(url: str, chunks: int) -> tuple[int, int]:
    """The extension, the two tables it reads and the postings of `TERMS`; (blocks, postings)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION ragservice_bm25 SCHEMA public")
        conn.execute(_POSTINGS)
        conn.execute(_STATS)
        conn.execute(
            "INSERT INTO collection_text_stats VALUES (%s, 0, %s, %s)",
            (COLLECTION, chunks, chunks * 60),
        )
        for lexeme, every in TERMS.items():
            params = {"c": COLLECTION, "l": lexeme, "n": chunks, "e": every, "b": BLOCK}
            conn.execute(_BLOCKS, params)
        conn.execute("VACUUM ANALYZE chunk_postings")
        row = conn.execute("SELECT count(*), sum(n) FROM chunk_postings").fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def peak_mb(url: str, work_mem: str, terms: list[str], k: int) -> tuple[float, float]:
    """One call on a fresh backend: (peak private memory above its start in MB, seconds)."""
    with psycopg.connect(url, row_factory=dict_row) as conn:
        row = conn.execute("SELECT pg_backend_pid() AS pid").fetchone()
        assert row is not None
        pid = int(row["pid"])
        # The postings' pages into the backend first (shared buffers are not private memory).
        conn.execute(
            "SELECT count(*) FROM chunk_postings WHERE collection_id = %s AND lexeme = ANY(%s)",
            (COLLECTION, terms),
        )
        conn.execute(f"SET work_mem = '{work_mem}'")
        base = _status_kb(pid, "RssAnon")
        poll = AnonPeak(pid)
        poll.start()
        began = time.perf_counter()
        conn.execute(
            "SELECT count(*) FROM ragservice_bm25_topk(%s, %s, NULL, %s, 1.2, 0.75)",
            ([COLLECTION], terms, k),
        ).fetchone()
        seconds = time.perf_counter() - began
        poll.done = True
        poll.join()
    return (poll.peak - base) / 1024, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=1_000_000)
    parser.add_argument("--k", type=int, default=10)
    args = parser.parse_args()

    server = embedded_database_url(Path(tempfile.mkdtemp(prefix="bm25-memory-")))
    libpq = make_url(server).set(drivername="postgresql").render_as_string(hide_password=False)
    name = f"bm25_memory_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(libpq, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    url = make_url(libpq).set(database=name).render_as_string(hide_password=False)
    try:
        began = time.perf_counter()
        blocks, postings = build(url, args.chunks)
        print(
            f"{args.chunks} chunks, {blocks} blocks, {postings} postings, "
            f"built in {time.perf_counter() - began:.0f} s",
            flush=True,
        )
        peaks: dict[str, dict[str, float]] = {}
        worst = 0.0
        for work_mem, mb in WORK_MEMS.items():
            peaks[work_mem] = {}
            for label, terms in QUERIES.items():
                peak, seconds = peak_mb(url, work_mem, terms, args.k)
                peaks[work_mem][label] = round(peak, 1)
                worst = max(worst, peak / mb)
                print(
                    f"work_mem {work_mem:>5} {label:<9} peak private +{peak:6.1f} MB "
                    f"{seconds * 1000:7.0f} ms",
                    flush=True,
                )
    finally:
        with psycopg.connect(libpq, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE {name} WITH (FORCE)")
    result: dict[str, Any] = {
        "chunks": args.chunks,
        "blocks": blocks,
        "postings": postings,
        "k": args.k,
        "peaks_mb": peaks,
        "worst_ratio": round(worst, 2),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
