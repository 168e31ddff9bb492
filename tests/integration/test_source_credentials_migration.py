"""Migration 0029: the credentials in sources' locations are split off into their own column
on the way up, and put back into the locations on the way down."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text

from ragservice import store
from ragservice.runtime import Runtime


def test_migration_0029_splits_credentials_off_locations_and_downgrades(
    runtime: Runtime, settings: Any
) -> None:
    from alembic import command
    from sqlalchemy import create_engine

    from ragservice.db import migrate

    with runtime.db.write() as session:
        tenant = runtime.default_tenant_id
        cid = store.collections.ensure_collection(session, tenant, "site")
        store.sources.add_source(
            session,
            store.sources.NewSource(
                tenant_id=tenant,
                collection_id=cid,
                kind="web",
                location="https://docs.example.org/a/",
                options={},
                readers=None,
                every_seconds=None,
                prune=True,
                credentials={"username": "ana", "password": "pa:ss/1"},
            ),
        )
    runtime.db.dispose()
    engine = create_engine(settings.database.owner_url.get_secret_value())
    config = migrate.alembic_config()
    insert = text(
        "INSERT INTO sources (tenant_id, collection_id, kind, location) "
        "VALUES (:tenant, :cid, 'web', :location)"
    )
    stored = text("SELECT location, credentials FROM sources ORDER BY location")
    try:
        with engine.connect() as conn:
            config.attributes["connection"] = conn
            command.downgrade(config, "0028")
            conn.commit()
            down = conn.execute(text("SELECT location FROM sources")).scalars().all()
            columns = (
                conn.execute(
                    text(
                        "SELECT column_name FROM information_schema.columns "
                        "WHERE table_name = 'sources'"
                    )
                )
                .scalars()
                .all()
            )
            for location in (
                "https://bob:hunter2@docs.example.org/b/",
                "https://docs.example.org/b/",  # the same without credentials: both stay
                "https://TOKEN123@git.example.org/",
                "s3://AKIAX:wJalr%2FK7@bucket/prefix",
            ):
                conn.execute(insert, {"tenant": tenant, "cid": cid, "location": location})
            conn.commit()
            command.upgrade(config, "head")
            conn.commit()
            up = conn.execute(stored).all()
    finally:
        engine.dispose()
    assert down == ["https://ana:pa%3Ass%2F1@docs.example.org/a/"]
    assert "credentials" not in columns
    assert [tuple(row) for row in up] == [
        ("https://docs.example.org/a/", {"username": "ana", "password": "pa:ss/1"}),
        ("https://docs.example.org/b/", None),
        ("https://docs.example.org/b/#2", {"username": "bob", "password": "hunter2"}),
        ("https://git.example.org/", {"username": "TOKEN123", "password": ""}),
        ("s3://bucket/prefix", {"username": "AKIAX", "password": "wJalr/K7"}),
    ]
