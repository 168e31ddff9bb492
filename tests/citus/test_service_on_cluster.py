"""The service on a distributed store: the API (with its job workers) on the Citus coordinator
of `citus_cluster`, after `ragservice db distribute`. Each test works in tenants of its own, so
the tests share the one distributed database."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from fastapi.testclient import TestClient
from psycopg import sql
from sqlalchemy import select

from ragservice import store
from ragservice.api.app import create_app
from ragservice.config import Settings
from ragservice.db import distribution, tenancy
from ragservice.db.engine import driver_connection_of, make_engine
from ragservice.db.models import Feedback
from ragservice.dev.citus import LOOPBACK, CitusCluster
from ragservice.embedding.embedder import SentenceTransformerEmbedder
from tests.api.conftest import make_key, ok, wait_for_job

DOCUMENTS = [
    ("pg", "PostgreSQL replication", "Streaming replicas replay the primary's WAL.", 2019),
    ("hnsw", "HNSW graphs", "Hierarchical navigable small world graphs index vectors.", 2021),
    ("bm25", "BM25 ranking", "Okapi BM25 scores term frequency against document length.", 2022),
    ("cats", "Cats", "Cats sleep for most of the day and purr when content.", 2023),
]


@pytest.fixture(scope="module")
def distributed(citus_cluster: CitusCluster) -> CitusCluster:
    """The cluster with the store distributed (idempotent: once for the session)."""
    with citus_cluster.coordinator_connection() as conn:
        distribution.distribute(conn)
    return citus_cluster


@pytest.fixture(scope="module")
def cluster_client(
    distributed: CitusCluster,
    embedder: SentenceTransformerEmbedder,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[TestClient]:
    from ingest.worker import JobWorker

    settings = Settings(
        database_url=distributed.service_url,
        owner_database_url=distributed.url,
        data_dir=tmp_path_factory.mktemp("cluster-app"),
        chunk_overlap_tokens=8,
        job_poll_seconds=0.2,
        workers=1,
    )
    app = create_app(settings, embedder=embedder, services=[JobWorker])
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


@dataclass(frozen=True)
class Tenant:
    name: str
    id: uuid.UUID
    reader: dict[str, str]
    writer: dict[str, str]
    admin: dict[str, str]

    def user(self, client: TestClient, name: str, role: str = "reader") -> dict[str, str]:
        return _key(client, self.id, role, name)


def _key(client: TestClient, tenant_id: uuid.UUID, role: str, user: str | None = None) -> dict:
    db = client.app.state.runtime.db  # type: ignore[attr-defined]
    with tenancy.as_system(), db.write() as session:
        return {"Authorization": f"Bearer {make_key(session, tenant_id, role, user)}"}


def new_tenant(client: TestClient) -> Tenant:
    db = client.app.state.runtime.db  # type: ignore[attr-defined]
    name = f"t-{uuid.uuid4().hex[:10]}"
    with tenancy.as_system(), db.write() as session:
        tenant_id = store.tenants.ensure_tenant(session, name)
    return Tenant(
        name,
        tenant_id,
        *(_key(client, tenant_id, role) for role in ("reader", "writer", "admin")),
    )


def add_corpus(client: TestClient, tenant: Tenant, collection: str = "kb") -> None:
    ok(client.post("/v1/collections", json={"name": collection}, headers=tenant.writer), 201)
    documents = [
        {"external_id": i, "title": t, "text": x, "metadata": {"year": y}}
        for i, t, x, y in DOCUMENTS
    ]
    job = ok(
        client.post(
            f"/v1/collections/{collection}/documents",
            json={"documents": documents},
            headers=tenant.writer,
        ),
        202,
    )
    assert wait_for_job(client, job["id"], tenant.writer)["status"] == "done"


@pytest.fixture
def tenant(cluster_client: TestClient) -> Tenant:
    found = new_tenant(cluster_client)
    add_corpus(cluster_client, found)
    return found


def search(client: TestClient, headers: dict[str, str], **body: Any) -> dict[str, Any]:
    result: dict[str, Any] = ok(client.post("/v1/search", json=body, headers=headers))
    return result


@pytest.mark.parametrize("mode", ["dense", "fulltext", "hybrid"])
def test_each_search_mode_finds_the_right_document(
    cluster_client: TestClient, tenant: Tenant, mode: str
) -> None:
    result = search(
        cluster_client,
        tenant.reader,
        query="Okapi BM25 term frequency",
        collections=["kb"],
        mode=mode,
        k=3,
    )
    top = result["results"][0]
    assert top["document"]["external_id"] == "bm25"
    assert "Okapi BM25" in top["text"]
    filtered = search(
        cluster_client,
        tenant.reader,
        query="graphs and replicas",
        collections=["kb"],
        mode=mode,
        k=10,
        filters={"year": {"$lte": 2021}},
    )
    assert {hit["document"]["external_id"] for hit in filtered["results"]} == {"pg", "hnsw"}


def test_a_tenant_sees_nothing_of_another(cluster_client: TestClient, tenant: Tenant) -> None:
    other = new_tenant(cluster_client)
    add_corpus(cluster_client, other, collection="other-kb")
    listed = ok(cluster_client.get("/v1/collections", headers=other.reader))
    assert [c["name"] for c in listed["collections"]] == ["other-kb"]
    missing = cluster_client.get("/v1/collections/kb/documents/bm25", headers=other.reader)
    assert missing.status_code == 404
    found = search(cluster_client, other.reader, query="Okapi BM25", mode="fulltext")
    assert {hit["collection"] for hit in found["results"]} == {"other-kb"}
    refused = cluster_client.post(
        "/v1/search", json={"query": "Okapi", "collections": ["kb"]}, headers=other.reader
    )
    assert refused.status_code == 404
    # The job queue stays on the coordinator (a Citus-managed local table): its policies too.
    jobs = ok(cluster_client.get("/v1/jobs", headers=tenant.admin))["jobs"]
    assert jobs
    for job in jobs:
        hidden = cluster_client.get(f"/v1/jobs/{job['id']}", headers=other.admin)
        assert hidden.status_code == 404
    theirs = ok(cluster_client.get("/v1/jobs", headers=other.admin))["jobs"]
    assert {job["id"] for job in theirs}.isdisjoint({job["id"] for job in jobs})


def test_readers_of_a_document_are_enforced_on_the_workers(
    cluster_client: TestClient, tenant: Tenant
) -> None:
    secret = {
        "external_id": "salaries",
        "title": "Salaries",
        "text": "The salary bands of the engineering ladder are confidential.",
        "readers": ["group:hr"],
    }
    job = ok(
        cluster_client.post(
            "/v1/collections/kb/documents", json={"documents": [secret]}, headers=tenant.admin
        ),
        202,
    )
    assert wait_for_job(cluster_client, job["id"], tenant.admin)["status"] == "done"
    db = cluster_client.app.state.runtime.db  # type: ignore[attr-defined]
    with tenancy.as_system(), db.write() as session:
        store.tenants.add_group_members(session, tenant.id, "hr", ["ana"])
    ana, bob = tenant.user(cluster_client, "ana"), tenant.user(cluster_client, "bob")
    for mode in ("dense", "fulltext", "hybrid"):
        seen_by_ana = search(cluster_client, ana, query="salary bands", mode=mode, k=10)
        seen_by_bob = search(cluster_client, bob, query="salary bands", mode=mode, k=10)
        assert "salaries" in {h["document"]["external_id"] for h in seen_by_ana["results"]}
        assert "salaries" not in {h["document"]["external_id"] for h in seen_by_bob["results"]}
    hidden = cluster_client.get("/v1/collections/kb/documents/salaries", headers=bob)
    assert hidden.status_code == 404


@pytest.mark.parametrize("mode", ["dense", "fulltext", "hybrid"])
def test_a_tenants_search_runs_as_one_task_on_one_worker(
    cluster_client: TestClient,
    tenant: Tenant,
    distributed: CitusCluster,
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
) -> None:
    """Every statement a search runs, explained on the coordinator within the tenant: one
    task, on a worker (a router query), each of them."""
    from ragservice.retrieval import statements
    from ragservice.retrieval.search import Searcher

    ran: list[Any] = []
    original = Searcher._run

    def recording(self: Searcher, statement: Any, then: Any = None) -> list[tuple[Any, ...]]:
        if statement.query is not statements.HAS_EXACT_BM25:  # reads the catalog only
            ran.append(statement)
        return original(self, statement, then)

    monkeypatch.setattr(Searcher, "_run", recording)
    search(cluster_client, tenant.reader, query="Okapi BM25 term frequency", mode=mode)
    assert ran
    workers = {f"port={worker.port}" for worker in distributed.workers}
    engine = make_engine(distributed.service_url)  # it knows the vector type
    try:
        with engine.connect() as connection:
            tenancy.apply(connection, tenancy.Tenancy(tenant_id=tenant.id), switch_role=False)
            raw = driver_connection_of(connection)
            for statement in ran:
                plan = "\n".join(
                    row[0]
                    for row in raw.execute(
                        sql.SQL("EXPLAIN {}").format(statement.query), statement.params
                    ).fetchall()
                )
                assert "Task Count: 1\n" in plan + "\n", plan
                assert any(worker in plan for worker in workers), plan
            texts = [statement.query.as_string(raw) for statement in ran]
            connection.rollback()
    finally:
        engine.dispose()
    # Full text is the exact C function, run on the worker over the tenant's shards.
    on_worker = any("ragservice_bm25_topk_tenant(" in text for text in texts)
    assert on_worker == (mode != "dense"), texts


def test_full_text_on_the_worker_scores_as_every_posting_read(
    cluster_client: TestClient, tenant: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The exact function on the tenant's worker ranks and scores as BM25 over every posting
    (the SQL statement with no budget, which the cluster ran before it had the function)."""
    from ragservice.retrieval.fulltext import FullTextEngine

    def hits(headers: dict[str, str]) -> list[tuple[str, float]]:
        found = search(
            cluster_client, headers, query="graphs of BM25 scores and replicas", mode="fulltext"
        )
        return [(h["document"]["external_id"], h["score"]) for h in found["results"]]

    ana = tenant.user(cluster_client, "ana")
    by_function = {"reader": hits(tenant.reader), "restricted": hits(ana)}
    searcher = cluster_client.app.state.search.searcher  # type: ignore[attr-defined]
    monkeypatch.setattr(searcher, "_fulltext", FullTextEngine(function=False, distributed=True))
    by_sql = {"reader": hits(tenant.reader), "restricted": hits(ana)}
    assert len(by_function["reader"]) >= 3
    for asker, expected in by_sql.items():
        assert [h[0] for h in by_function[asker]] == [h[0] for h in expected], asker
        assert [h[1] for h in by_function[asker]] == pytest.approx([h[1] for h in expected])


HR = [
    {
        "external_id": "leave",
        "title": "Parental leave",
        "text": "Parents get sixteen weeks of paid parental leave.",
    },
    {
        "external_id": "travel",
        "title": "Travel",
        "text": "Book flights through the travel desk two weeks ahead.",
    },
]
QUESTION = "How many weeks of parental leave do parents get?"


def _ingest(client: TestClient, tenant: Tenant, documents: list[dict[str, Any]]) -> None:
    job = ok(
        client.post(
            "/v1/collections/hr/documents", json={"documents": documents}, headers=tenant.writer
        ),
        202,
    )
    assert wait_for_job(client, job["id"], tenant.writer)["status"] == "done"


def test_answers_the_cache_and_its_invalidation_feedback_and_insights(
    cluster_client: TestClient,
) -> None:
    tenant = new_tenant(cluster_client)
    ok(cluster_client.post("/v1/collections", json={"name": "hr"}, headers=tenant.writer), 201)
    _ingest(cluster_client, tenant, HR)
    ask = {"question": QUESTION, "collections": ["hr"]}
    first = ok(cluster_client.post("/v1/query", json=ask, headers=tenant.reader))
    again = ok(cluster_client.post("/v1/query", json=ask, headers=tenant.reader))
    assert "sixteen weeks" in first["answer"]
    assert first["cache"]["hit"] is False and again["cache"]["hit"] is True
    # A changed source drops the entry: the documents' trigger, on the tenant's shards.
    _ingest(cluster_client, tenant, [{**HR[0], "text": "Parents get twenty weeks of leave."}])
    after = ok(cluster_client.post("/v1/query", json=ask, headers=tenant.reader))
    assert after["cache"]["hit"] is False and "twenty weeks" in after["answer"]
    feedback = {"query_id": after["query_id"], "rating": -1, "comment": "was sixteen"}
    ok(cluster_client.post("/v1/feedback", json=feedback, headers=tenant.reader), 201)
    db = cluster_client.app.state.runtime.db  # type: ignore[attr-defined]
    with tenancy.as_tenant(tenant.id), db.read() as session:
        stored = session.scalars(select(Feedback.comment)).all()
    assert stored == ["was sixteen"]
    insights = ok(cluster_client.get("/v1/insights", headers=tenant.admin))
    assert QUESTION in str(insights)
    other = new_tenant(cluster_client)
    assert QUESTION not in str(ok(cluster_client.get("/v1/insights", headers=other.admin)))
    refused = cluster_client.post("/v1/feedback", json=feedback, headers=other.reader)
    assert refused.status_code == 404


def _worker_port(distributed: CitusCluster, tenant_id: uuid.UUID) -> int:
    with distributed.coordinator_connection() as conn:
        row = conn.execute(
            "SELECT n.nodeport FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid) "
            "WHERE p.shardid = get_shard_id_for_distribution_column('public.collections', %s)",
            (tenant_id,),
        ).fetchone()
    assert row is not None
    return int(row[0])


def _placement(distributed: CitusCluster, tenant_id: uuid.UUID) -> tuple[int, int]:
    """(shard id, worker port) of the tenant's collections shard."""
    with distributed.coordinator_connection() as conn:
        row = conn.execute(
            "SELECT p.shardid, n.nodeport FROM pg_dist_placement p "
            "JOIN pg_dist_node n USING (groupid) WHERE p.shardid = "
            "get_shard_id_for_distribution_column('public.collections', %s)",
            (tenant_id,),
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def test_a_tenant_moves_to_a_worker_of_its_own_while_it_ingests_and_answers(
    cluster_client: TestClient, distributed: CitusCluster
) -> None:
    """The tenant's rows are split off into shards of their own (isolate_tenant_to_new_shard)
    and moved to a new worker while one client ingests documents one by one and another
    searches: nothing lost or doubled, no search failed, at most the one upload in flight at
    the split failed (whole), the same answers after as before.
    Both steps block the tenant's writes while they copy (`block_writes`: its requests wait);
    the moves through logical replication stall on chunk_postings (docs/scaling.md)."""
    import threading
    import time

    tenant = new_tenant(cluster_client)
    add_corpus(cluster_client, tenant)
    # The load writes to a collection of its own: the answers from "kb" stay comparable.
    ok(cluster_client.post("/v1/collections", json={"name": "notes"}, headers=tenant.writer), 201)
    query = {"query": "Okapi BM25 term frequency", "collections": ["kb"], "k": 4}
    before = search(cluster_client, tenant.reader, **query)
    stop = threading.Event()
    written: list[str] = []
    failures: dict[str, int] = {"ingest": 0, "search": 0}
    errors: list[Any] = []
    lost: list[str] = []

    def ingest() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            doc = {"external_id": f"moving-{n}", "text": f"Note {n} about shard moves."}
            reply = cluster_client.post(
                "/v1/collections/notes/documents",
                json={"documents": [doc]},
                headers=tenant.writer,
            )
            job = reply.json() if reply.status_code == 202 else None
            done = job and wait_for_job(cluster_client, job["id"], tenant.writer)
            if done and done["status"] == "done":
                written.append(doc["external_id"])
            else:
                failures["ingest"] += 1
                errors.append(done or reply.text)
                lost.append(doc["external_id"])

    def ask() -> None:
        while not stop.is_set():
            reply = cluster_client.post("/v1/search", json=query, headers=tenant.reader)
            if reply.status_code != 200:
                failures["search"] += 1
            time.sleep(0.05)

    threads = [threading.Thread(target=ingest), threading.Thread(target=ask)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(1.0)
        new_worker = distributed.add_worker()
        with distributed.coordinator_connection() as conn:
            conn.execute("SET statement_timeout = '180s'")  # a stuck move fails the test
            shard = conn.execute(
                "SELECT isolate_tenant_to_new_shard('public.collections', %s, 'CASCADE', "
                "shard_transfer_mode => 'block_writes')",
                (tenant.id,),
            ).fetchone()[0]  # type: ignore[index]
            _, port = _placement(distributed, tenant.id)
            conn.execute(
                "SELECT citus_move_shard_placement(%s, %s, %s, %s, %s, "
                "shard_transfer_mode => 'block_writes')",
                (shard, LOOPBACK, port, LOOPBACK, new_worker.port),
            )
        time.sleep(1.0)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=120)
    assert _placement(distributed, tenant.id) == (shard, new_worker.port)
    listed = ok(
        cluster_client.get("/v1/collections/notes/documents?limit=1000", headers=tenant.reader)
    )
    ids = [d["external_id"] for d in listed["documents"]]
    assert len(ids) == len(set(ids))  # nothing doubled
    assert set(written) <= set(ids)  # nothing lost
    assert len(written) >= 1
    after = search(cluster_client, tenant.reader, **query)
    assert [h["chunk_id"] for h in after["results"]] == [h["chunk_id"] for h in before["results"]]
    # A request in flight when the split drops the tenant's old shard can fail ("could not find
    # valid entry for shard"; an upload about one run in three, a search once in a fresh
    # clone's run): an upload's job fails whole (nothing of it stored), and either may be sent
    # again. Nothing else fails.
    assert failures["search"] <= 1 and failures["ingest"] <= 1, errors
    assert not set(lost) & set(ids)


def test_a_new_worker_takes_its_share_of_the_shards_by_a_rebalance(
    cluster_client: TestClient, distributed: CitusCluster
) -> None:
    """`citus_add_node`, then `citus_rebalance_start` (block_writes) and its wait: shards move
    onto the new worker, and every tenant's answers are the same after as before."""
    tenants = [new_tenant(cluster_client) for _ in range(3)]
    for tenant in tenants:
        add_corpus(cluster_client, tenant)
    query = {"query": "Okapi BM25 term frequency", "collections": ["kb"], "k": 4}
    before = [search(cluster_client, t.reader, **query)["results"] for t in tenants]
    new_worker = distributed.add_worker()
    with distributed.coordinator_connection() as conn:
        conn.execute("SET statement_timeout = '300s'")
        conn.execute("SELECT citus_rebalance_start(shard_transfer_mode => 'block_writes')")
        conn.execute("SELECT citus_rebalance_wait()")
        moved = conn.execute(
            "SELECT count(*) FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid) "
            "JOIN pg_dist_shard s USING (shardid) "
            "WHERE n.nodeport = %s AND s.logicalrelid = 'public.collections'::regclass",
            (new_worker.port,),
        ).fetchone()
    assert moved is not None and moved[0] >= 1
    after = [search(cluster_client, t.reader, **query)["results"] for t in tenants]
    assert [[h["chunk_id"] for h in hits] for hits in after] == [
        [h["chunk_id"] for h in hits] for hits in before
    ]


def test_the_vectors_migration_runs_on_a_distributed_store(
    distributed: CitusCluster, cluster_client: TestClient, tenant: Tenant
) -> None:
    """0034 down and up again on a store already distributed (it changes the shared schema and
    puts it back): the vectors' readers and collection are filled on the shards, the readers'
    policy is folded into the tenant's (no restrictive policy for Citus to
    widen on the shards), and each tenant still finds its own documents, and only those."""
    from sqlalchemy import create_engine

    from tests.integration.test_tenant_keys_migration import _migrate

    other = new_tenant(cluster_client)
    add_corpus(cluster_client, other, collection="other-kb")
    engine = create_engine(distributed.url)
    try:
        with engine.begin() as conn:
            _migrate(conn, "downgrade", "0033")
        with engine.begin() as conn:
            _migrate(conn, "upgrade", "head")
    finally:
        engine.dispose()
    cluster_client.app.state.runtime.db.dispose()  # type: ignore[attr-defined]
    with distributed.coordinator_connection() as conn:
        policies = conn.execute(
            "SELECT polname, polpermissive FROM pg_policy "
            "WHERE polrelid = 'chunk_embeddings'::regclass"
        ).fetchall()
        mismatched = conn.execute(
            "SELECT count(*) FROM chunk_embeddings e JOIN chunks c "
            "ON c.id = e.chunk_id AND c.tenant_id = e.tenant_id "
            "WHERE e.collection_id <> c.collection_id OR e.readers IS DISTINCT FROM c.readers"
        ).fetchone()
    assert policies == [("tenant_isolation", True)]
    assert mismatched == (0,)
    for who, collection in ((tenant, "kb"), (other, "other-kb")):
        found = search(cluster_client, who.reader, query="HNSW graphs", mode="dense", k=10)
        assert found["results"][0]["document"]["external_id"] == "hnsw"
        assert {hit["collection"] for hit in found["results"]} == {collection}


def test_a_worker_down_is_a_503_for_its_tenants_only(
    cluster_client: TestClient, distributed: CitusCluster
) -> None:
    """Runs last in this module: it stops a worker (and starts it again; the coordinator's
    cached connections to it then fail once, see docs/scaling.md)."""
    by_port: dict[int, Tenant] = {}
    while len(by_port) < 2:
        found = new_tenant(cluster_client)
        by_port.setdefault(_worker_port(distributed, found.id), found)
    for found in by_port.values():
        ok(cluster_client.post("/v1/collections", json={"name": "kb"}, headers=found.writer), 201)
    down_port, up_port = sorted(by_port)
    [down] = [worker for worker in distributed.workers if worker.port == down_port]
    down.stop()
    try:
        refused = cluster_client.get("/v1/collections", headers=by_port[down_port].reader)
        served = cluster_client.get("/v1/collections", headers=by_port[up_port].reader)
    finally:
        down.start()
    assert refused.status_code == 503, refused.text
    assert served.status_code == 200, served.text
    assert [c["name"] for c in served.json()["collections"]] == ["kb"]
    after = cluster_client.get("/v1/collections", headers=by_port[down_port].reader)
    assert after.status_code == 200, after.text
