"""Settings come from RAGSERVICE_* variables, grouped by subject; chunking settings are checked
against the model."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from ragservice.config import (
    DEFAULT_EMBEDDING_MODEL,
    GROUPS,
    IngestSettings,
    SearchSettings,
    Settings,
    SettingsGroup,
    get_settings,
)
from ragservice.errors import ConfigurationError
from ragservice.runtime import chunking_options


def test_defaults_mean_embedded_database_and_bundled_model(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("RAGSERVICE_DATABASE_URL", "RAGSERVICE_DATA_DIR", "RAGSERVICE_EMBEDDING_MODEL"):
        monkeypatch.delenv(var, raising=False)
    settings = Settings()
    assert settings.database_url is None
    assert settings.data_dir == Path(".ragservice")
    assert settings.embedding_model == DEFAULT_EMBEDDING_MODEL
    assert settings.device == "auto"


def test_environment_variables_with_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGSERVICE_DATABASE_URL", "postgresql://db/rag")
    monkeypatch.setenv("RAGSERVICE_EMBED_BATCH_SIZE", "128")
    monkeypatch.setenv("RAGSERVICE_DEVICE", "cpu")
    settings = Settings()
    assert settings.database_url is not None
    assert (
        settings.database_url.get_secret_value(),
        settings.embed_batch_size,
        settings.device,
    ) == ("postgresql://db/rag", 128, "cpu")


def test_secrets_never_show_in_the_settings_repr() -> None:
    settings = Settings(
        database_url="postgresql://rag:pw-1@db/rag",
        replicas="eu=postgresql://rag:pw-2@replica/rag",
        inference_api_key="sk-3",
    )
    shown = f"{settings!r} {settings} {settings.model_dump()}"
    assert "pw-1" not in shown and "pw-2" not in shown and "sk-3" not in shown
    assert settings.replication.replica_urls() == [("eu", "postgresql://rag:pw-2@replica/rag")]


def test_get_settings_is_built_once() -> None:
    get_settings.cache_clear()
    assert get_settings() is get_settings()
    get_settings.cache_clear()


def test_bad_values_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGSERVICE_DEVICE", "tpu")
    with pytest.raises(ValidationError, match="device"):
        Settings()
    monkeypatch.delenv("RAGSERVICE_DEVICE")
    with pytest.raises(ValidationError, match="half the chunk size"):
        Settings(chunk_max_tokens=64, chunk_overlap_tokens=40)


def test_chunk_size_defaults_to_and_never_exceeds_the_model() -> None:
    assert chunking_options(Settings().ingest, 254).max_tokens == 254
    assert chunking_options(Settings(chunk_max_tokens=128).ingest, 254).max_tokens == 128
    with pytest.raises(ConfigurationError, match="exceeds"):
        chunking_options(Settings(chunk_max_tokens=512).ingest, 254)
    with pytest.raises(ConfigurationError, match="overlap"):
        chunking_options(Settings(chunk_overlap_tokens=200).ingest, 254)


def _ef_settings(monkeypatch: pytest.MonkeyPatch, **env: str) -> Settings:
    for storage in ("", "_FLOAT32", "_HALFVEC", "_BINARY"):
        monkeypatch.delenv(f"RAGSERVICE_HNSW_EF_SEARCH{storage}", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(f"RAGSERVICE_{name}", value)
    return Settings()


def test_each_storage_searches_with_its_own_ef_search_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ragservice.config import DEFAULT_EF_SEARCH
    from ragservice.retrieval.options import SearchOptions

    options = SearchOptions.from_settings(_ef_settings(monkeypatch))
    assert {s: options.ef_search_for(s) for s in DEFAULT_EF_SEARCH} == DEFAULT_EF_SEARCH


def test_one_ef_search_still_sets_every_storage_and_a_storage_setting_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ragservice.retrieval.options import SearchOptions

    settings = _ef_settings(monkeypatch, HNSW_EF_SEARCH="300", HNSW_EF_SEARCH_HALFVEC="60")
    assert settings.search.ef_search_by_storage() == {"float32": 300, "halfvec": 60, "binary": 300}
    options = SearchOptions.from_settings(settings)
    assert (options.ef_search_for("float32"), options.ef_search_for("halfvec")) == (300, 60)


def test_an_ef_search_given_for_a_search_wins_over_every_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dataclasses import replace

    from ragservice.errors import InvalidInputError
    from ragservice.retrieval.options import SearchOptions

    options = SearchOptions.from_settings(_ef_settings(monkeypatch, HNSW_EF_SEARCH_BINARY="70"))
    given = replace(options, ef_search=25)
    assert [given.ef_search_for(s) for s in ("float32", "halfvec", "binary")] == [25, 25, 25]
    with pytest.raises(InvalidInputError):
        replace(options, ef_search=0)


def test_every_setting_is_in_exactly_one_group() -> None:
    owners: dict[str, list[str]] = {}
    for name, group in GROUPS.items():
        for field in group.model_fields:
            owners.setdefault(field, []).append(name)
    assert set(owners) == set(Settings.model_fields)
    assert {field: names for field, names in owners.items() if len(names) > 1} == {}
    in_order = [field for group in GROUPS.values() for field in group.model_fields]
    assert list(Settings.model_fields) == in_order


def test_groups_the_lead_relies_on_hold_their_subjects() -> None:
    fields = {name: set(group.model_fields) for name, group in GROUPS.items()}
    named = set(Settings.model_fields)
    assert {f for f in named if f.startswith(("search_", "bm25_", "hnsw_ef_search"))} | {
        "binary_rescore_factor"
    } == fields["search"]
    assert {f for f in named if f.startswith("inference_")} == fields["inference"]
    assert {f for f in named if f.startswith("cache_")} == fields["cache"]
    assert {
        "context_max_tokens",
        "context_neighbours",
        "system_prompt",
        "answer_html",
        "answer_link_hosts",
        "rerank_candidates",
        "reranker",
    } <= fields["answering"]
    document = {"max_document_pages", "max_document_chars"}  # ingest's per-file limits
    assert {f for f in named if f.startswith("max_")} - document == fields["limits"]
    assert document <= fields["ingest"]


def test_each_group_holds_the_values_of_its_settings() -> None:
    settings = Settings(
        search_rrf_k=7, bm25_k1=1.5, cache_enabled=False, max_k=50, inference_model="m", workers=0
    )
    for name, kind in GROUPS.items():
        group = getattr(settings, name)
        assert type(group) is kind
        assert group.model_dump() == {f: getattr(settings, f) for f in kind.model_fields}
    assert (settings.search.search_rrf_k, settings.search.bm25_k1) == (7, 1.5)
    assert (settings.cache.cache_enabled, settings.limits.max_k) == (False, 50)


def test_groups_are_built_once_immutable_and_fresh_in_a_copy() -> None:
    settings = Settings(search_rrf_k=7)
    assert settings.search is settings.search
    with pytest.raises(ValidationError, match="frozen"):
        settings.search.search_rrf_k = 8
    changed = settings.model_copy(update={"search_rrf_k": 9})
    assert (changed.search.search_rrf_k, settings.search.search_rrf_k) == (9, 7)
    settings.search_rrf_k = 10
    assert settings.search.search_rrf_k == 10
    assert settings == Settings(search_rrf_k=10) != changed  # the cache is not a value


def test_the_variable_names_are_unchanged_in_the_environment_and_an_env_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("RAGSERVICE_SEARCH_RRF_K", "12")
    monkeypatch.setenv("RAGSERVICE_BM25_K1", "1.2")
    assert (Settings().search.search_rrf_k, Settings().search.bm25_k1) == (12, 1.2)
    monkeypatch.delenv("RAGSERVICE_SEARCH_RRF_K")
    monkeypatch.delenv("RAGSERVICE_BM25_K1")
    env_file = tmp_path / ".env"
    env_file.write_text("RAGSERVICE_SEARCH_RRF_K=13\nRAGSERVICE_CACHE_TTL_SECONDS=60\n")
    read = Settings(_env_file=env_file)
    assert (read.search.search_rrf_k, read.cache.cache_ttl_seconds) == (13, 60)
    # As before, the service reads no .env of its own accord.
    monkeypatch.chdir(tmp_path)
    assert Settings().search.search_rrf_k == SearchSettings().search_rrf_k == 30


def test_bm25_k1_has_the_api_s_bound() -> None:
    Settings(bm25_k1=10)
    with pytest.raises(ValidationError, match="bm25_k1"):
        Settings(bm25_k1=10.5)


def test_a_group_checks_its_own_values() -> None:
    assert issubclass(SearchSettings, SettingsGroup)
    with pytest.raises(ValidationError, match="half the chunk size"):
        IngestSettings(chunk_max_tokens=64, chunk_overlap_tokens=40)
    assert Settings(replicas="eu=postgresql://r/db").replication.replica_urls() == [
        ("eu", "postgresql://r/db")
    ]
