"""The schema rewrites `ragservice db distribute` makes for Citus, as text (the cluster runs them
in tests/citus)."""

from __future__ import annotations

import pytest

from ragservice.db.citus_schema import (
    UnsupportedTriggerError,
    shard_local_body,
    without_setting_subqueries,
)

TABLES = ("chunks", "chunk_postings", "prompt_cache", "prompt_cache_sources")


def test_settings_subqueries_become_direct_calls_and_other_subqueries_stay() -> None:
    policy = (
        "((tenant_id = ( SELECT ragservice_current_tenant() AS ragservice_current_tenant)) OR "
        "( SELECT public.ragservice_all_tenants() AS ragservice_all_tenants) OR "
        "(EXISTS ( SELECT 1 FROM documents d WHERE (d.id = x))))"
    )
    assert without_setting_subqueries(policy) == (
        "((tenant_id = ragservice_current_tenant()) OR public.ragservice_all_tenants() OR "
        "(EXISTS ( SELECT 1 FROM documents d WHERE (d.id = x))))"
    )
    assert without_setting_subqueries(None) is None


def test_statements_naming_distributed_tables_run_on_the_colocated_shards() -> None:
    body = """
DECLARE
    saved text := '';
BEGIN
    PERFORM set_config('x', '*', true);
    IF coalesce(current_setting('y', true), '') = 'on' THEN
    INSERT INTO chunk_postings (n) SELECT count(*) FROM new_chunks WHERE tag LIKE 'a%';
    ELSE
    DELETE FROM prompt_cache c USING public.prompt_cache_sources s, new_chunks n
    WHERE s.entry_id = c.id AND c.prompt_cache_hits > 0;
    END IF;
    UPDATE other_table SET n = 1;
    RETURN NULL;
END """
    rewritten = shard_local_body(body, TABLES)
    local = "public.ragservice_local_table(TG_TABLE_NAME, TG_TABLE_SCHEMA, '{}')"
    assert (
        "EXECUTE format($ragservice_shard$INSERT INTO %1$s (n) SELECT count(*) FROM new_chunks "
        f"WHERE tag LIKE 'a%%'$ragservice_shard$, {local.format('chunk_postings')});"
    ) in rewritten
    assert (
        "EXECUTE format($ragservice_shard$DELETE FROM %1$s c USING %2$s s, new_chunks n\n"
        "    WHERE s.entry_id = c.id AND c.prompt_cache_hits > 0$ragservice_shard$, "
        f"{local.format('prompt_cache')}, {local.format('prompt_cache_sources')});"
    ) in rewritten
    assert "IF coalesce(current_setting('y', true), '') = 'on' THEN\n    EXECUTE" in rewritten
    assert "ELSE\n    EXECUTE" in rewritten
    assert "    UPDATE other_table SET n = 1;" in rewritten  # not a distributed table
    assert "PERFORM set_config('x', '*', true);" in rewritten
    assert shard_local_body(rewritten, TABLES) == rewritten  # once is enough


def test_a_statement_using_the_functions_variables_is_not_rewritten() -> None:
    body = (
        "DECLARE\n    limit_rows integer := 3;\n"
        "BEGIN\n    DELETE FROM chunks WHERE n > limit_rows;\nEND"
    )
    with pytest.raises(UnsupportedTriggerError, match="limit_rows"):
        shard_local_body(body, TABLES)
