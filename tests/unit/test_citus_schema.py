"""The schema rewrites `ragservice db distribute` makes for Citus, as text (the cluster runs them
in tests/citus), and which full text a searcher runs there."""

from __future__ import annotations

import uuid

import pytest

from ragservice.db import tenancy
from ragservice.db.citus_schema import (
    LOGIN_VARIABLE,
    UnsupportedTriggerError,
    rows_function_body,
    shard_local_body,
    without_setting_subqueries,
)
from ragservice.retrieval.fulltext import EVERY_POSTING, FullTextEngine
from ragservice.retrieval.options import SearchOptions
from ragservice.retrieval.statements import bm25

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


def test_a_views_function_reads_the_analyst_once_as_the_sessions_login() -> None:
    body = rows_function_body(
        "SELECT q.id FROM query_log q WHERE EXISTS (SELECT 1 FROM analyst_tenants a "
        "WHERE a.role_name = CURRENT_USER AND a.tenant_id = q.tenant_id);"
    )
    assert "CURRENT_USER" not in body.upper().replace(LOGIN_VARIABLE.upper(), "")
    assert f"{LOGIN_VARIABLE} name := session_user;" in body
    assert f"a.role_name = {LOGIN_VARIABLE} AND" in body
    assert body.startswith("#variable_conflict use_column\n")
    assert body.endswith("q.tenant_id);\nEND")


@pytest.mark.parametrize(
    ("probe", "function", "of_tenant", "budget"),
    [
        ((True, False, False), True, False, 500),  # one server with the extension
        ((False, False, False), False, False, 500),  # an external server without it
        ((True, True, True), True, True, 500),  # Citus, distributed with the tenant's function
        ((True, True, False), False, False, EVERY_POSTING),  # Citus, distributed before it
    ],
)
def test_full_text_runs_the_function_where_it_can_read_the_postings(
    probe: tuple[bool, bool, bool], function: bool, of_tenant: bool, budget: int
) -> None:
    options = SearchOptions(bm25_postings_per_term=500)
    engine = FullTextEngine()
    asked: list[int] = []

    def ask() -> tuple[bool, bool, bool]:
        asked.append(1)
        return probe

    tenant = uuid.uuid4()
    with tenancy.as_tenant(tenant):
        assert engine.exact(options, ask) is function
        assert engine.budget(options, ask) == budget
    assert engine.of_tenant is of_tenant
    assert len(asked) == 1  # asked once per searcher
    if engine.distributed:  # across tenants the function cannot run on Citus: every posting
        with tenancy.as_system():
            assert engine.exact(options, ask) is False
            assert engine.budget(options, ask) == EVERY_POSTING
    statement = bm25(None, 10, exact=function, tenant=tenant, of_tenant=engine.of_tenant)
    text = statement.as_string(None)
    assert ("ragservice_bm25_topk_tenant(%(tenant)s::uuid," in text) is of_tenant
    assert ("ragservice_bm25_topk(" in text) is (function and not of_tenant)
