"""Every statement the searcher builds names the tenant it runs for.

A store distributed by tenant_id (Citus) runs a statement as one task on one worker only when
each tenant-owned table it reads is restricted to the tenant, and it joins distributed tables
only on their distribution column. So within each query block (a SELECT, a CTE's body, a
subquery) the tenant-owned tables are joined on tenant_id, and for one tenant at least one of
them carries `tenant_id = %(tenant)s`; across all tenants, none does.

The statements are captured from the searcher itself (its `_run` replaced), for every kind of
search it runs, and read by a small tokenizer: no database is needed. What they return against
PostgreSQL, and their plans, are checked in tests/integration/test_search.py.
"""

from __future__ import annotations

import itertools
import re
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from ragservice.db import tenancy
from ragservice.retrieval.filters import parse_and_compile
from ragservice.retrieval.search import FixedModel, Mode, Searcher, SearchHit, SearchOptions

TENANT = uuid.UUID("00000000-0000-0000-0000-0000000000aa")
COLLECTION = uuid.UUID("00000000-0000-0000-0000-0000000000c1")
DIMENSION = 4

TENANT_TABLES = frozenset(
    {
        "chunks",
        "chunk_embeddings",
        "documents",
        "collections",
        "chunk_postings",
        "collection_text_stats",
    }
)
"""Tables split by tenant_id whose rows a search reads."""

FILTERS: dict[str, object] = {
    "no filter": None,
    "document filter": {"year": {"$gte": 2020}},
    "chunk filter": {"chunk.lang": "en"},
}
STORAGES = ("float32", "halfvec", "binary")


# -- capturing the statements ----------------------------------------------------------------


@dataclass(frozen=True)
class Captured:
    sql: str
    params: dict[str, Any]


@dataclass
class Recorder:
    statements: list[Captured] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self, statement: Any, then: Any = None) -> list[tuple[Any, ...]]:
        """`Searcher._run` without a database: the statement (and the one `then` makes of its
        rows) recorded, no rows returned."""
        self.record(statement)
        if then is not None:
            self.record(then([]))
        return []

    def record(self, statement: Any) -> None:
        with self.lock:  # the full-text side runs on a worker thread
            self.statements.append(Captured(statement.query.as_string(), dict(statement.params)))


@dataclass(frozen=True)
class Variant:
    mode: Mode
    storage: str
    filters: str
    exact: bool
    prf: bool
    group_documents: bool
    readers: frozenset[str] | None

    @property
    def name(self) -> str:
        parts = [str(self.mode), self.storage, self.filters, "exact" if self.exact else "sql"]
        parts += ["prf"] * self.prf + ["documents"] * self.group_documents
        return " ".join(parts + ["restricted"] * (self.readers is not None))


def variants() -> Iterator[Variant]:
    """Every kind of search: dense of each storage, full text (SQL and exact), hybrid, with and
    without filters, feedback and document grouping, for a reader of every document and for a
    restricted one."""
    for mode, storage, filters, exact, prf, documents, readers in itertools.product(
        Mode, STORAGES, FILTERS, (False, True), (False, True), (False, True), (None, {"user:a"})
    ):
        if mode is Mode.FULLTEXT and storage != "float32":
            continue  # full text reads no vectors
        if mode is Mode.DENSE and (exact or prf):
            continue  # nor dense search postings
        restricted = None if readers is None else frozenset(readers)
        yield Variant(mode, storage, filters, exact, prf, documents, restricted)


def captured(variant: Variant, tenancy_now: tenancy.Tenancy) -> list[Captured]:
    """The statements one search (and a look-up of its hits' neighbours) runs, within
    `tenancy_now`."""
    recorder = Recorder()
    model = FixedModel(
        id=7,
        dimension=DIMENSION,
        embed=lambda _query: np.ones(DIMENSION, dtype=np.float32),
        storage=variant.storage,
    )
    options = SearchOptions(
        mode=variant.mode,
        k=5,
        filters=parse_and_compile(FILTERS[variant.filters]),
        bm25_exact=variant.exact,
        prf=variant.prf,
        group_documents=variant.group_documents,
    )
    searcher = Searcher(None, models=lambda: model, exact_bm25=variant.exact)  # type: ignore[arg-type]
    with pytest.MonkeyPatch.context() as patch, tenancy.within(tenancy_now), searcher:
        patch.setattr(Searcher, "_run", recorder.run)
        searcher.search(collection_ids=[COLLECTION], query="heart attack risk", options=options)
        searcher.neighbours([_hit()], 1)
    return recorder.statements


def _hit() -> SearchHit:
    return SearchHit(
        chunk_id=uuid.uuid4(),
        score=1.0,
        text="",
        ordinal=0,
        start_char=0,
        end_char=0,
        chunk_metadata={},
        collection_id=COLLECTION,
        collection="c",
        document_id=uuid.uuid4(),
        external_id="x",
        title=None,
        document_metadata={},
    )


def for_tenant(variant: Variant) -> tenancy.Tenancy:
    return tenancy.Tenancy(tenant_id=TENANT, readers=variant.readers)


# -- reading the SQL -------------------------------------------------------------------------

_TOKEN = re.compile(r"'(?:[^']|'')*'|%\(\w+\)s|\w+(?:\.\w+)*|::|<>|<=|>=|\S")
_NOT_ALIASES = frozenset(
    {"where", "join", "on", "using", "cross", "inner", "left", "right", "full", "natural"}
    | {"lateral", "order", "group", "limit", "having", "union", "window", "tablesample"}
)


@dataclass
class Block:
    """One query block: its own tokens (those of nested expressions included, as `(` ... `)`),
    and the query blocks nested in it."""

    tokens: list[str] = field(default_factory=list)
    nested: list[Block] = field(default_factory=list)


def blocks(statement: str) -> list[Block]:
    """Every query block of the statement."""
    tokens = _TOKEN.findall(statement)
    root, position = _group(tokens, 0)
    assert position == len(tokens), f"unbalanced parentheses in {statement}"
    found: list[Block] = []
    pending = [root]
    while pending:
        block = pending.pop()
        found.append(block)
        pending.extend(block.nested)
    return found


def _group(tokens: list[str], position: int) -> tuple[Block, int]:
    """The block from `position` to its closing parenthesis (or the end), and where it ends."""
    block = Block()
    while position < len(tokens) and tokens[position] != ")":
        token = tokens[position]
        position += 1
        if token != "(":
            block.tokens.append(token)
            continue
        inner, position = _group(tokens, position)
        assert position < len(tokens), "unbalanced parentheses"
        position += 1  # the closing parenthesis
        if any(t.lower() == "select" for t in inner.tokens):
            block.nested.append(inner)  # a query of its own (a CTE, a subquery)
            block.tokens.append("<query>")
        else:  # an expression, a USING list: part of this block
            block.tokens += ["(", *inner.tokens, ")"]
            block.nested += inner.nested
    return block, position


@dataclass(frozen=True)
class Scope:
    """What one query block says about the tenant-owned tables it reads."""

    aliases: dict[str, str]  # alias -> table
    restricted: frozenset[str]  # aliases with `tenant_id = %(tenant)s`
    joined: frozenset[frozenset[str]]  # pairs of aliases equated on tenant_id


def scope(block: Block) -> Scope:
    tokens = block.tokens
    aliases: dict[str, str] = {}
    joined: set[frozenset[str]] = set()
    for i, token in enumerate(tokens):
        if token.lower() not in TENANT_TABLES:
            continue
        before = tokens[i - 1].lower() if i else ""
        assert before in ("from", "join", ","), (
            f"{token} is read in a way this test does not know: {' '.join(tokens)}"
        )
        alias, end = _alias(tokens, i)
        assert alias not in aliases, f"alias {alias} bound twice in one block"
        aliases[alias] = token.lower()
        if tokens[end : end + 2] == ["USING", "("]:
            names = tokens[end + 2 : tokens.index(")", end)]
            if "tenant_id" in names:
                joined |= {frozenset({alias, other}) for other in aliases if other != alias}
    restricted: set[str] = set()
    for i in range(1, len(tokens) - 1):
        if tokens[i] != "=":
            continue
        left, right = tokens[i - 1], tokens[i + 1]
        sides = [side.removesuffix(".tenant_id") for side in (left, right)]
        tenant_sides = [s for s, raw in zip(sides, (left, right), strict=True) if s != raw]
        if len(tenant_sides) == 2:
            joined.add(frozenset(tenant_sides))
        elif len(tenant_sides) == 1 and "%(tenant)s" in (left, right):
            restricted.add(tenant_sides[0])
    return Scope(aliases, frozenset(restricted), frozenset(joined))


def _alias(tokens: list[str], i: int) -> tuple[str, int]:
    """The name the table at `i` goes by (its alias, or its own name), and where what follows
    the binding starts."""
    rest = [t.lower() for t in tokens[i + 1 : i + 3]]
    if rest[:1] == ["as"]:
        return tokens[i + 2], i + 3
    if rest and rest[0].isidentifier() and rest[0] not in _NOT_ALIASES:
        return tokens[i + 1], i + 2
    return tokens[i], i + 1


def problems(statement: str, *, tenant: bool) -> list[str]:
    """What keeps the statement from running as one task for its tenant (`tenant`), or across
    all tenants from joining its shards; empty when nothing does."""
    found: list[str] = []
    if not tenant and "%(tenant)s" in statement:
        found.append("a tenant predicate across all tenants")
    for block in blocks(statement):
        seen = scope(block)
        if not seen.aliases:
            continue
        text = " ".join(block.tokens)
        components = _components(set(seen.aliases), seen.joined)
        if len(components) > 1:
            parts = " / ".join(",".join(sorted(c)) for c in components)
            found.append(f"tenant-owned tables not joined on tenant_id ({parts}) in: {text}")
        for component in components:
            if tenant and not component & seen.restricted:
                names = ",".join(sorted(component))
                found.append(f"{names} not restricted to the tenant in: {text}")
    return found


def _components(aliases: set[str], joined: frozenset[frozenset[str]]) -> list[set[str]]:
    components: list[set[str]] = []
    for alias in sorted(aliases):
        merged = {alias}
        for pair in joined:
            if alias in pair and pair <= aliases:
                merged |= pair
        touching = [c for c in components if c & merged]
        for c in touching:
            components.remove(c)
            merged |= c
        components.append(merged)
    return components


def without_tenant(statement: str) -> str:
    return " ".join(re.sub(r"AND \w+\.tenant_id = %\(tenant\)s::uuid", "", statement).split())


# -- the tests -------------------------------------------------------------------------------


def test_the_reader_finds_a_join_without_the_tenant() -> None:
    """The check itself: a tenant-owned table joined on its key alone, or not restricted,
    or a tenant predicate where there is no tenant, is reported."""
    good = (
        "WITH r AS (SELECT c.id FROM chunks c WHERE c.seq = 1 AND c.tenant_id = %(tenant)s::uuid)"
        " SELECT * FROM r JOIN chunks c ON c.id = r.id AND c.tenant_id = %(tenant)s::uuid"
        " JOIN documents d ON d.id = c.document_id AND d.tenant_id = c.tenant_id"
    )
    assert problems(good, tenant=True) == []
    keyed_only = good.replace(" AND d.tenant_id = c.tenant_id", "")
    assert any("not joined on tenant_id" in p for p in problems(keyed_only, tenant=True))
    inner_unrestricted = good.replace(" AND c.tenant_id = %(tenant)s::uuid)", ")")
    assert any("not restricted" in p for p in problems(inner_unrestricted, tenant=True))
    lateral = good + (
        " CROSS JOIN LATERAL (SELECT n.id FROM chunks n WHERE n.document_id = d.id) AS n"
    )
    assert any("n not restricted" in p for p in problems(lateral, tenant=True))
    comma = good + ", collections col"
    assert any("not joined on tenant_id" in p for p in problems(comma, tenant=True))
    using = good + " JOIN chunk_embeddings AS e USING (chunk_id{})"
    assert problems(using.format(", tenant_id"), tenant=True) == []
    assert any("not joined on tenant_id" in p for p in problems(using.format(""), tenant=True))
    assert problems(good, tenant=False) == ["a tenant predicate across all tenants"]
    assert problems(without_tenant(good), tenant=False) == []
    assert any("not joined" in p for p in problems(without_tenant(keyed_only), tenant=False))


def test_variants_cover_every_statement_piece() -> None:
    """The searches below build each piece of `retrieval.statements` (so the checks reach
    them all)."""
    joined = "\n".join({s.sql for v in variants() for s in captured(v, for_tenant(v))})
    for piece in (
        "nearest AS MATERIALIZED",  # dense
        "embedding_half::halfvec",  # halfvec
        "coarse AS MATERIALIZED",  # binary
        "FROM chunk_postings p",  # BM25 over the postings
        "ragservice_bm25_topk",  # exact BM25
        "%(depth)s",  # exact BM25 for a restricted asker
        "CROSS JOIN LATERAL (SELECT c.id, c.document_id FROM chunks c",  # visible chunks
        "JOIN documents d ON d.id = c.document_id",  # document filters
        "chunk_terms AS",  # feedback
        "unnest(%(terms)s::text[], %(weights)s::float8[])",  # the expanded query
        "unnest(%(ids)s::uuid[], %(scores)s::float8[])",  # hits ranked here
        "JOIN chunks n ON n.document_id = h.document_id",  # neighbours
    ):
        assert piece in joined, piece


@pytest.mark.parametrize("variant", list(variants()), ids=lambda v: v.name)
def test_every_statement_is_restricted_to_the_tenant(variant: Variant) -> None:
    statements = captured(variant, for_tenant(variant))
    assert statements
    for statement in statements:
        assert problems(statement.sql, tenant=True) == [], statement.sql
        if "%(tenant)s" in statement.sql:
            assert statement.params["tenant"] == TENANT


@pytest.mark.parametrize("system", [True, False], ids=["system", "no tenant"])
@pytest.mark.parametrize("variant", list(variants()), ids=lambda v: v.name)
def test_across_tenants_statements_name_no_tenant(variant: Variant, system: bool) -> None:
    """Without a tenant (all tenants, or none) the statements are those of one tenant less the
    tenant predicates: the joins on tenant_id stay (a statement over every tenant's shards
    needs them). Working across tenants reads every document."""
    readers = None if system else variant.readers
    across = tenancy.SYSTEM if system else tenancy.Tenancy(readers=readers)
    statements = captured(variant, across)
    for statement in statements:
        assert problems(statement.sql, tenant=False) == [], statement.sql
        assert statement.params.get("tenant") is None
    one_tenant = captured(variant, tenancy.Tenancy(tenant_id=TENANT, readers=readers))
    assert sorted(" ".join(s.sql.split()) for s in statements) == sorted(
        without_tenant(s.sql) for s in one_tenant
    )
