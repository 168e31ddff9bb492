"""The `ragservice_bm25` extension against postings blocks it did not write: every malformed
block (a seq outside its block's range, NULL bounds or elements, arrays of unequal length, a huge
n) is a clean ERROR that leaves the backend alive; one call's memory stays within `work_mem`
(a slower, windowed scan when the fast paths would not fit, the same ranking); and the extension
is not trusted, so only a superuser installs it.

Each test has a database of its own with the extension and bare `chunk_postings` and
`collection_text_stats` tables (no constraints: rows no trigger of the service would write)."""

from __future__ import annotations

import math
import re
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row
from sqlalchemy.engine import make_url

COLLECTION = uuid.UUID("00000000-0000-0000-0000-0000000000c1")

_TABLES = """
CREATE TABLE public.chunk_postings (
    collection_id uuid, lexeme text COLLATE "C", tier smallint, first_seq bigint,
    last_seq bigint, n integer, seqs bigint[], tfs smallint[], lengths integer[],
    max_tf smallint, min_len integer
);
CREATE TABLE public.collection_text_stats (
    collection_id uuid, slot integer, chunk_count bigint, token_count bigint
);
"""

_TOPK = "SELECT seq, score FROM ragservice_bm25_topk(%s, %s, %s, %s, %s, %s)"

Conn = psycopg.Connection[dict[str, Any]]


def _libpq(url: str, database: str | None = None, **parts: Any) -> str:
    parsed = make_url(url).set(drivername="postgresql", **parts)
    if database is not None:
        parsed = parsed.set(database=database)
    return parsed.render_as_string(hide_password=False)


@contextmanager
def _scratch_database(pg_admin_url: str) -> Iterator[str]:
    name = f"rs_bm25_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(_libpq(pg_admin_url), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield name
    finally:
        with psycopg.connect(_libpq(pg_admin_url), autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@pytest.fixture
def blocks_db(pg_admin_url: str) -> Iterator[str]:
    """A libpq URL to a database with the extension and bare postings tables."""
    with _scratch_database(pg_admin_url) as name:
        url = _libpq(pg_admin_url, name)
        with psycopg.connect(url, autocommit=True) as conn:
            available = conn.execute(
                "SELECT 1 FROM pg_available_extensions WHERE name = 'ragservice_bm25'"
            ).fetchone()
            if available is None:
                pytest.skip("the test server has no ragservice_bm25 extension files")
            conn.execute("CREATE EXTENSION ragservice_bm25 SCHEMA public")
            conn.execute(_TABLES)
        yield url


@pytest.fixture
def conn(blocks_db: str) -> Iterator[Conn]:
    with psycopg.connect(blocks_db, row_factory=dict_row) as c:
        yield c


def put_block(
    conn: Conn,
    lexeme: str,
    seqs: Sequence[int | None],
    *,
    tfs: Sequence[int | None] | None = None,
    lengths: Sequence[int | None] | None = None,
    tier: int = 0,
    first_seq: Any = ...,
    last_seq: Any = ...,
    n: Any = ...,
    max_tf: Any = ...,
    min_len: Any = ...,
) -> None:
    """One block; its bounds from its postings unless given (None: NULL)."""
    tfs = list(tfs) if tfs is not None else [1] * len(seqs)
    lengths = list(lengths) if lengths is not None else [10] * len(seqs)
    known = [s for s in seqs if s is not None]
    values = {
        "first_seq": min(known) if first_seq is ... else first_seq,
        "last_seq": max(known) if last_seq is ... else last_seq,
        "n": len(seqs) if n is ... else n,
        "max_tf": max(t for t in tfs if t is not None) if max_tf is ... else max_tf,
        "min_len": min(x for x in lengths if x is not None) if min_len is ... else min_len,
    }
    conn.execute(
        "INSERT INTO chunk_postings VALUES (%s, %s, %s, %s, %s, %s, %s::int8[], %s::int2[], "
        "%s::int4[], %s, %s)",
        (
            COLLECTION, lexeme, tier, values["first_seq"], values["last_seq"], values["n"],
            list(seqs), tfs, lengths, values["max_tf"], values["min_len"],
        ),
    )  # fmt: skip


def put_totals(conn: Conn, chunks: int, tokens: int) -> None:
    conn.execute(
        "INSERT INTO collection_text_stats VALUES (%s, 0, %s, %s)", (COLLECTION, chunks, tokens)
    )


def top_k(
    conn: Conn,
    terms: Sequence[str],
    k: int,
    *,
    weights: Sequence[float] | None = None,
    accumulator: str = "auto",
    exhaustive_min_postings: int = 65536,
    work_mem: str | None = None,
) -> dict[int, float]:
    conn.execute(
        "SELECT set_config('ragservice_bm25.accumulator', %s, true), "
        "set_config('ragservice_bm25.exhaustive_min_postings', %s, true)",
        (accumulator, str(exhaustive_min_postings)),
    )
    if work_mem is not None:
        conn.execute("SELECT set_config('work_mem', %s, true)", (work_mem,))
    rows = conn.execute(_TOPK, ([COLLECTION], list(terms), weights, k, 1.2, 0.75)).fetchall()
    return {row["seq"]: row["score"] for row in rows}


def assert_clean_error(conn: Conn, match: str, call: Any) -> None:
    """`call` fails with an ERROR matching `match`; the same backend answers afterwards."""
    pid = conn.execute("SELECT pg_backend_pid() AS pid").fetchone()["pid"]  # type: ignore[index]
    with pytest.raises(psycopg.Error, match=match) as failure:
        call()
    assert failure.value.sqlstate is not None, failure.value  # the server's ERROR, no lost link
    conn.rollback()
    row = conn.execute("SELECT 1 AS one, pg_backend_pid() AS pid").fetchone()
    assert row == {"one": 1, "pid": pid}


# -- malformed blocks ----------------------------------------------------------------------

# A block whose bounds say [1, 2] holding a posting 2^40 seqs further: the search's arrays are
# sized from the bounds. Term "b" has enough short blocks that the first round leaves some
# unread, so that the search goes on to complete the live chunks (phase 3).
FAR = 2**40


def _far_posting(conn: Conn) -> None:
    put_totals(conn, 1000, 10_000)
    put_block(conn, "a", [1, FAR], tfs=[50, 50], lengths=[1, 1], first_seq=1, last_seq=2)
    for seq in range(10, 30):
        put_block(conn, "b", [seq], tfs=[1], lengths=[1000])
    conn.commit()


@pytest.mark.parametrize(
    ("accumulator", "exhaustive_min_postings"), [("array", 65536), ("hash", 65536), ("auto", 0)]
)
def test_a_posting_outside_its_blocks_range_is_an_error(
    conn: Conn, accumulator: str, exhaustive_min_postings: int
) -> None:
    _far_posting(conn)
    assert_clean_error(
        conn,
        "outside",
        lambda: top_k(
            conn, ["a", "b"], 1, accumulator=accumulator,
            exhaustive_min_postings=exhaustive_min_postings,
        ),
    )  # fmt: skip


def test_a_posting_outside_the_range_is_an_error_on_the_exhaustive_scan(conn: Conn) -> None:
    """A negative weight: the bounds do not hold and every block is scanned."""
    _far_posting(conn)
    assert_clean_error(conn, "outside", lambda: top_k(conn, ["a", "b"], 1, weights=[1.0, -1.0]))


@pytest.mark.parametrize("column", ["first_seq", "last_seq", "n", "max_tf", "min_len"])
def test_a_null_bound_is_an_error(conn: Conn, column: str) -> None:
    put_totals(conn, 100, 1000)
    put_block(conn, "a", [1, 2, 3])
    put_block(conn, "a", [5, 6], **{column: None})
    conn.commit()
    assert_clean_error(conn, f"null {column}", lambda: top_k(conn, ["a"], 2))


@pytest.mark.parametrize("column", ["seqs", "tfs", "lengths"])
def test_a_null_element_is_an_error(conn: Conn, column: str) -> None:
    put_totals(conn, 100, 1000)
    arrays: dict[str, list[int | None]] = {
        "seqs": [1, 2, 3], "tfs": [1, 1, 1], "lengths": [10, 10, 10],
    }  # fmt: skip
    arrays[column][1] = None
    put_block(conn, "a", arrays["seqs"], tfs=arrays["tfs"], lengths=arrays["lengths"],
              first_seq=1, last_seq=3, max_tf=1, min_len=10)  # fmt: skip
    conn.commit()
    assert_clean_error(conn, "null element", lambda: top_k(conn, ["a"], 2))


@pytest.mark.parametrize("column", ["tfs", "lengths"])
def test_arrays_of_unequal_length_are_an_error(conn: Conn, column: str) -> None:
    put_totals(conn, 100, 1000)
    arrays = {"tfs": [1, 1, 1], "lengths": [10, 10, 10]}
    arrays[column] = arrays[column][:2]
    put_block(conn, "a", [1, 2, 3], tfs=arrays["tfs"], lengths=arrays["lengths"],
              max_tf=1, min_len=10)  # fmt: skip
    conn.commit()
    assert_clean_error(conn, "length", lambda: top_k(conn, ["a"], 2))


def test_a_block_whose_n_differs_from_its_arrays_is_an_error(conn: Conn) -> None:
    put_totals(conn, 100, 1000)
    put_block(conn, "a", [1, 2, 3], n=2)
    conn.commit()
    assert_clean_error(conn, "n = 2", lambda: top_k(conn, ["a"], 2))


@pytest.mark.parametrize("n", [2**31 - 1, -5])
def test_a_huge_or_negative_n_is_an_error(conn: Conn, n: int) -> None:
    put_totals(conn, 100, 1000)
    put_block(conn, "a", [1, 2, 3])
    put_block(conn, "a", [5, 6], n=n)
    conn.commit()
    assert_clean_error(conn, f"n = {n}", lambda: top_k(conn, ["a"], 2))


def test_a_block_range_upside_down_or_wider_than_int64_is_an_error(conn: Conn) -> None:
    put_totals(conn, 100, 1000)
    put_block(conn, "a", [5], first_seq=9, last_seq=1)
    conn.commit()
    assert_clean_error(conn, "seq range", lambda: top_k(conn, ["a"], 2))
    conn.execute("TRUNCATE chunk_postings")
    put_block(conn, "a", [-(2**63)], first_seq=-(2**63))
    put_block(conn, "a", [2**63 - 1], last_seq=2**63 - 1)
    conn.commit()
    # a range of 2^64 seqs: no array over it, the hash or the windows take it
    for accumulator in ("auto", "array"):
        found = top_k(conn, ["a"], 5, accumulator=accumulator)
        assert set(found) == {-(2**63), 2**63 - 1}
        conn.rollback()


def test_the_blocks_function_refuses_unequal_arrays_and_null_elements(conn: Conn) -> None:
    call = "SELECT count(*) FROM ragservice_bm25_blocks(%s::int8[], %s::tsvector[])"
    assert_clean_error(
        conn, "2 seqs but 1 tsvectors", lambda: conn.execute(call, ([1, 2], ["a:1"]))
    )
    assert_clean_error(conn, "null", lambda: conn.execute(call, ([1, None], ["a:1", "b:2"])))
    assert_clean_error(
        conn, "one-dimensional", lambda: conn.execute(call, ([[1], [2]], ["a:1", "b:2"]))
    )
    assert conn.execute(call, ([1, 2], ["a:1", "b:2 a:3"])).fetchone() == {"count": 2}


# -- memory --------------------------------------------------------------------------------


def reference_scores(conn: Conn, weights: dict[str, float]) -> dict[int, float]:
    """Exhaustive BM25 (k1 1.2, b 0.75) over the table's blocks, in Python."""
    totals = conn.execute(
        "SELECT sum(chunk_count)::float8 AS n, sum(token_count)::float8 AS t "
        "FROM collection_text_stats"
    ).fetchone()
    assert totals is not None
    n, avgdl = totals["n"], totals["t"] / totals["n"]
    scores: dict[int, float] = {}
    for term, weight in weights.items():
        rows = conn.execute(
            "SELECT seqs, tfs, lengths FROM chunk_postings WHERE lexeme = %s", (term,)
        ).fetchall()
        df = sum(len(r["seqs"]) for r in rows)
        idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
        for r in rows:
            for seq, tf, length in zip(r["seqs"], r["tfs"], r["lengths"], strict=True):
                part = tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * length / avgdl))
                scores[seq] = scores.get(seq, 0.0) + weight * idf * part
    return scores


def fill_spread(conn: Conn, chunks: int, step: int) -> None:
    """Three terms over `chunks` chunks `step` seqs apart, in blocks of 128 (SQL-generated)."""
    put_totals(conn, chunks, chunks * 12)
    conn.execute(
        """
        INSERT INTO chunk_postings
        SELECT %(c)s, t.lexeme, 0, min(p.seq), max(p.seq), count(*),
               array_agg(p.seq ORDER BY p.seq), array_agg(p.tf ORDER BY p.seq),
               array_agg(p.len ORDER BY p.seq), max(p.tf), min(p.len)
        FROM (VALUES ('a', 2), ('b', 3), ('c', 7)) AS t(lexeme, every)
        CROSS JOIN LATERAL (
            SELECT i::int8 * %(step)s AS seq, (1 + (i * 7919) %% 5)::int2 AS tf,
                   (5 + (i * 104729) %% 20)::int4 AS len, row_number() OVER (ORDER BY i) AS r
            FROM generate_series(0::int8, %(chunks)s - 1) AS i WHERE i %% t.every = 0
        ) AS p
        GROUP BY t.lexeme, (p.r - 1) / 128
        """,
        {"c": COLLECTION, "chunks": chunks, "step": step},
    )
    conn.commit()


def assert_top_k(found: dict[int, float], expected: dict[int, float], k: int) -> None:
    ranked = sorted(expected.values(), reverse=True)
    cut = ranked[min(k, len(ranked)) - 1]
    assert len(found) >= min(k, len(ranked))
    for seq, score in found.items():
        assert score == pytest.approx(expected[seq], rel=1e-9)
        assert score >= cut - 1e-9 * cut
    assert {s for s, v in expected.items() if v > cut + 1e-9 * cut} <= set(found)


@pytest.mark.parametrize(
    ("accumulator", "exhaustive_min_postings", "weights"),
    [
        ("auto", 65536, None),
        ("array", 65536, None),
        ("hash", 65536, None),
        ("auto", 0, None),
        ("auto", 65536, [1.0, -0.5, 2.0]),  # the bounds do not hold: every block scanned
    ],
)
def test_a_call_over_work_mem_scans_in_windows_with_the_same_ranking(
    conn: Conn, accumulator: str, exhaustive_min_postings: int, weights: list[float] | None
) -> None:
    """20,000 chunks: the fast paths' arrays (24 bytes or 8 bytes a seq) do not fit in 64 or
    200 kB; the call scans the blocks in windows of seqs that do, and ranks as exhaustive BM25
    as with room to spare."""
    fill_spread(conn, 20_000, 1)
    terms = ["a", "b", "c"]
    expected = reference_scores(conn, dict(zip(terms, weights or [1.0] * 3, strict=True)))
    for k in (1, 10, 300):
        options = {"accumulator": accumulator, "exhaustive_min_postings": exhaustive_min_postings}
        roomy = top_k(conn, terms, k, weights=weights, work_mem="64MB", **options)  # type: ignore[arg-type]
        conn.rollback()
        assert_top_k(roomy, expected, k)
        # 64 kB: too many blocks to list; 200 kB: listed, the partial scores do not fit. (Sums
        # in another order may differ by an ulp: which chunks tie at the cut may differ.)
        for work_mem in ("64kB", "200kB"):
            tight = top_k(conn, terms, k, weights=weights, work_mem=work_mem, **options)  # type: ignore[arg-type]
            conn.rollback()
            assert_top_k(tight, expected, k)


def test_a_sparse_seq_range_over_work_mem_is_scanned_in_halves(conn: Conn) -> None:
    """Chunks a million seqs apart: no array over the range; the windows halve until a hash of
    what fits in work_mem holds each."""
    fill_spread(conn, 6_000, 1_000_003)
    terms = ["a", "b", "c"]
    expected = reference_scores(conn, dict.fromkeys(terms, 1.0))
    for accumulator in ("auto", "hash"):
        found = top_k(conn, terms, 50, accumulator=accumulator, work_mem="64kB")
        conn.rollback()
        assert_top_k(found, expected, 50)


def test_a_k_whose_results_cannot_fit_in_work_mem_is_an_error_naming_it(conn: Conn) -> None:
    fill_spread(conn, 2_000, 1)
    assert_clean_error(conn, "work_mem", lambda: top_k(conn, ["a"], 100_000, work_mem="64kB"))


def _peak_rss_kb(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1])


def test_one_calls_peak_memory_stays_near_work_mem(blocks_db: str) -> None:
    """Postings one a page apart over 4M seqs: an array over the range would be touched on
    every page. With work_mem at 1 MB the backend's peak resident memory grows by a few MB at
    most (the executor's own and the blocks read), not by the range."""
    with psycopg.connect(blocks_db, row_factory=dict_row) as c:
        fill_spread(c, 8_192, 512)
    with psycopg.connect(blocks_db, row_factory=dict_row) as c:
        pid = c.execute("SELECT pg_backend_pid() AS pid").fetchone()["pid"]  # type: ignore[index]
        if not Path(f"/proc/{pid}/status").exists():
            pytest.skip("the test server's backends are not on this machine")
        c.execute("SELECT ragservice_bm25_last_stats()")  # loads the library
        before = _peak_rss_kb(pid)
        for accumulator, minimum in (("array", 65536), ("auto", 0), ("hash", 65536)):
            found = top_k(
                c, ["a", "b", "c"], 10, accumulator=accumulator,
                exhaustive_min_postings=minimum, work_mem="1MB",
            )  # fmt: skip
            assert len(found) >= 10
            c.rollback()
        grown = _peak_rss_kb(pid) - before
    assert grown < 12 * 1024, f"peak RSS grew by {grown} kB"


def top_k_memory_peak(
    conn: Conn, terms: Sequence[str], k: int, **options: Any
) -> tuple[dict[int, float], int]:
    """top_k, and how far the backend's memory in contexts rose above its level at the call's
    start, at its highest (the extension's DEBUG1 report: every memory context of the backend,
    sampled at every row the call reads)."""
    notes: list[str] = []

    def note(diagnostic: psycopg.errors.Diagnostic) -> None:
        notes.append(diagnostic.message_primary or "")

    conn.add_notice_handler(note)
    try:
        conn.execute("SELECT set_config('client_min_messages', 'debug1', true)")
        found = top_k(conn, terms, k, **options)
    finally:
        conn.remove_notice_handler(note)
    peaks = [
        int(m.group(1))
        for n in notes
        if (m := re.match(r"ragservice_bm25: memory peak (\d+) bytes above the call's start", n))
    ]
    assert len(peaks) == 1, notes
    return found, peaks[0]


MB = 1024 * 1024


@pytest.mark.parametrize("step", [1, 16])
def test_one_calls_memory_stays_within_twice_work_mem(conn: Conn, step: int) -> None:
    """300,000 chunks (214,000 of them in a query of three terms), their seqs `step` apart: at
    1 and 4 MB of work_mem, whichever way the call goes (the pruning's array or hash, over its
    budget or giving up; the windows as arrays or as hashes), the backend's memory in contexts
    rises by at most twice work_mem and 1 MB (SPI's and the executor's own, the results), with
    the same ranking as with room to spare. (A window's hash that grew of its own accord below
    its threshold, as PostgreSQL's simplehash does on long probes, held every chunk of the
    window: at 1 MB it left no room for the chunks tying at the k-th score, an ERROR.)"""
    fill_spread(conn, 300_000, step)
    terms = ["a", "b", "c"]
    roomy = top_k(conn, terms, 10, work_mem="256MB")  # also loads the catalogs' caches
    conn.rollback()
    for work_mem in (1, 4):
        for accumulator, minimum in (("auto", 65536), ("hash", 65536), ("auto", 0)):
            found, peak = top_k_memory_peak(
                conn, terms, 10, accumulator=accumulator, exhaustive_min_postings=minimum,
                work_mem=f"{work_mem}MB",
            )  # fmt: skip
            conn.rollback()
            assert found.keys() == roomy.keys(), (work_mem, accumulator, minimum)
            for seq, score in found.items():
                assert score == pytest.approx(roomy[seq], rel=1e-9)
            assert peak <= 2 * work_mem * MB + 1 * MB, (
                f"work_mem {work_mem} MB, {accumulator}, {minimum}: memory peak {peak / MB:.1f} MB"
            )


def _rss_anon_kb(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("RssAnon:")).split()[1])


class _RssAnonPeak(threading.Thread):
    """A backend's private resident memory, polled every half millisecond: its highest."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak = _rss_anon_kb(pid)
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.peak = max(self.peak, _rss_anon_kb(self.pid))
            time.sleep(0.0005)


def test_one_calls_private_memory_peak_stays_near_work_mem(blocks_db: str) -> None:
    """The same from outside: the backend's private resident memory (RssAnon, which the shared
    buffers are not part of) rises by a few MB at most during a call of 1 MB of work_mem over
    the 214,000 chunks of a query of three terms (1 MB measured). The poll may miss a short
    peak, never add one: the bound is loose, against a hash holding them all (5 MB and more)."""
    with psycopg.connect(blocks_db, row_factory=dict_row) as c:
        fill_spread(c, 300_000, 1)
    grown = []
    for accumulator, minimum in (("auto", 65536), ("hash", 65536)):
        with psycopg.connect(blocks_db, row_factory=dict_row) as c:
            pid = c.execute("SELECT pg_backend_pid() AS pid").fetchone()["pid"]  # type: ignore[index]
            if not Path(f"/proc/{pid}/status").exists():
                pytest.skip("the test server's backends are not on this machine")
            top_k(c, ["none"], 10, work_mem="1MB")  # loads the library and the catalogs' caches
            c.rollback()
            before = _rss_anon_kb(pid)
            poll = _RssAnonPeak(pid)
            poll.start()
            try:
                found = top_k(
                    c, ["a", "b", "c"], 10, accumulator=accumulator,
                    exhaustive_min_postings=minimum, work_mem="1MB",
                )  # fmt: skip
            finally:
                poll.stop.set()
                poll.join()
            assert len(found) >= 10
            grown.append(poll.peak - before)
    assert max(grown) < 5 * 1024, f"private memory grew by {grown} kB"


# -- installing ----------------------------------------------------------------------------


def test_the_extension_is_not_trusted(conn: Conn) -> None:
    rows = conn.execute(
        "SELECT version, superuser, trusted FROM pg_available_extension_versions "
        "WHERE name = 'ragservice_bm25'"
    ).fetchall()
    assert rows and all(r["superuser"] and not r["trusted"] for r in rows), rows


def test_a_database_owner_who_is_no_superuser_may_not_install_it(pg_admin_url: str) -> None:
    role, password = f"rs_bm25_owner_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    with psycopg.connect(_libpq(pg_admin_url), autocommit=True) as c:
        c.execute(
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                sql.Identifier(role), sql.Literal(password)
            )
        )
    try:
        with _scratch_database(pg_admin_url) as name:
            with psycopg.connect(_libpq(pg_admin_url, name), autocommit=True) as c:
                c.execute(
                    sql.SQL("ALTER DATABASE {} OWNER TO {}").format(
                        sql.Identifier(name), sql.Identifier(role)
                    )
                )
                c.execute(sql.SQL("ALTER SCHEMA public OWNER TO {}").format(sql.Identifier(role)))
            owner_url = _libpq(pg_admin_url, name, username=role, password=password)
            with psycopg.connect(owner_url, autocommit=True) as c:
                c.execute(_TABLES)  # a chunk_postings of the owner's own making
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    c.execute("CREATE EXTENSION ragservice_bm25 SCHEMA public")
    finally:
        with psycopg.connect(_libpq(pg_admin_url), autocommit=True) as c:
            c.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))
