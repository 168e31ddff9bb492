"""The analysts' views and a newly registered embedding model on the distributed store of
`citus_cluster`: what `tests/integration/test_analysts_scoped.py` asserts on one server, each
view read by analyst logins on the coordinator."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest

from ragservice import store
from ragservice.config import Settings
from ragservice.db import Database, distribution, open_database, tenancy
from ragservice.dev.citus import CitusCluster
from tests.integration.test_analysts_scoped import connect, view_rows
from tests.integration.test_analytics import VIEWS, Seeded, new_analyst, seed

MODEL = "fake"


@pytest.fixture(scope="module")
def cluster_db(
    citus_cluster: CitusCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Database]:
    with citus_cluster.coordinator_connection() as conn:
        distribution.distribute(conn)
    settings = Settings(
        database_url=citus_cluster.service_url,
        owner_database_url=citus_cluster.url,
        data_dir=tmp_path_factory.mktemp("cluster-analysts"),
    )
    db = open_database(settings, route_reads=False)
    try:
        yield db
    finally:
        db.dispose()


def _register_model(db: Database) -> int:
    """The seed's model, registered after the store was distributed: its HNSW index is DDL on
    every worker, run as the owner although the service works as its system role."""
    with tenancy.as_system(), db.write() as session:
        model = store.embedding_models.ensure_model(
            session, name=MODEL, dimension=4, path=None, hnsw_m=8, hnsw_ef_construction=16
        )
        return model.id


@dataclass(frozen=True)
class Named:
    name: str
    seeded: Seeded


@pytest.fixture(scope="module")
def two_tenants(cluster_db: Database) -> tuple[Named, Named]:
    """Two tenants with rows in every view (names of their own: the cluster is shared)."""
    _register_model(cluster_db)
    suffix = uuid.uuid4().hex[:8]
    with tenancy.as_system():
        return tuple(  # type: ignore[return-value]
            Named(name, seed(cluster_db, name)) for name in (f"acme-{suffix}", f"globex-{suffix}")
        )


def test_a_model_registered_after_distribution_gets_its_index_on_every_worker(
    cluster_db: Database, citus_cluster: CitusCluster, two_tenants: tuple[Named, Named]
) -> None:
    model_id = _register_model(cluster_db)  # again: idempotent
    index = f"chunk_embeddings_hnsw_model_{model_id}"
    for worker in citus_cluster.workers:
        with psycopg.connect(worker.conninfo, autocommit=True) as conn:
            conn.execute("SET citus.override_table_visibility = off")
            found = conn.execute(
                "SELECT count(*) FROM pg_class WHERE relkind = 'i' AND relname LIKE %s",
                (index + "%",),
            ).fetchone()
            assert found is not None and found[0] >= 1, worker.name


def _tenants_of(rows: list[dict[str, object]], names: set[str]) -> set[object]:
    return {row["tenant"] for row in rows} & names


def test_a_tenant_bound_analyst_sees_its_tenants_rows_only(
    cluster_db: Database, citus_cluster: CitusCluster, two_tenants: tuple[Named, Named]
) -> None:
    acme, globex = two_tenants
    names = {acme.name, globex.name}
    url = citus_cluster.url
    with (
        new_analyst(cluster_db, acme.seeded.tenant) as bound,
        new_analyst(cluster_db, None) as everyone,
        new_analyst(cluster_db, globex.seeded.tenant) as unbound,
        connect(url, *bound) as as_bound,
        connect(url, *everyone) as as_everyone,
        connect(url, *unbound) as as_unbound,
    ):
        with citus_cluster.coordinator_connection() as owner:
            owner.execute("DELETE FROM analyst_tenants WHERE role_name = %s", (unbound[0],))
        for view in VIEWS:
            seen, every = view_rows(as_bound, view), view_rows(as_everyone, view)
            assert seen, view
            assert {row["tenant"] for row in seen} == {acme.name}, view
            assert _tenants_of(every, names) == names, view
            acme_rows = [row for row in every if row["tenant"] == acme.name]
            assert sorted(map(repr, seen)) == sorted(map(repr, acme_rows)), view
            assert view_rows(as_unbound, view) == [], view  # no binding: nothing (fail closed)
        wide = as_bound.execute(
            "SELECT count(*) AS n FROM analytics.negative_feedback WHERE tenant = %s "
            "OR tenant_id = %s OR true",
            (globex.name, globex.seeded.tenant),
        ).fetchone()
        assert wide == {"n": 2}
        # Neither the tables, the binding nor the shards are theirs to read.
        for statement in (
            "SELECT * FROM analyst_tenants",
            "SELECT * FROM query_log",
            "INSERT INTO analyst_tenants VALUES (current_user, NULL)",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                as_bound.execute(statement)


def test_loads_merge_their_postings_on_a_distributed_store(cluster_db: Database) -> None:
    """No pack follows a load on Citus (`pack_postings`), so a large batch is not written in
    append mode there: its blocks merge into the open ones as they go."""
    from sqlalchemy import text

    with tenancy.as_system(), cluster_db.write() as session:
        store.postings.append_postings(session)
        setting = session.scalar(text("SELECT current_setting('ragservice.postings_append', true)"))
        packed = store.postings.pack_postings(session, None)
    assert setting in (None, "", "off")
    assert (packed.collections, packed.blocks_before) == (0, 0)
