"""Settings come from RAGSERVICE_* variables, grouped by subject; chunking settings are checked
against the model."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError
from pydantic_settings import EnvSettingsSource

from ragservice.config import (
    DEFAULT_EMBEDDING_MODEL,
    FLAT_NAMES,
    GROUPS,
    CacheSettings,
    GroupedEnvironment,
    IngestSettings,
    SearchSettings,
    Settings,
    SettingsGroup,
    env_name,
    get_settings,
)
from ragservice.errors import ConfigurationError
from ragservice.runtime import chunking_options


def test_defaults_mean_embedded_database_and_bundled_model(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("RAGSERVICE_DATABASE_URL", "RAGSERVICE_DATA_DIR", "RAGSERVICE_EMBEDDING_MODEL"):
        monkeypatch.delenv(var, raising=False)
    settings = Settings()
    assert settings.database.url is None
    assert settings.database.data_dir == Path(".ragservice")
    assert settings.embedding.model == DEFAULT_EMBEDDING_MODEL
    assert settings.embedding.device == "auto"


def test_environment_variables_with_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGSERVICE_DATABASE_URL", "postgresql://db/rag")
    monkeypatch.setenv("RAGSERVICE_EMBED_BATCH_SIZE", "128")
    monkeypatch.setenv("RAGSERVICE_DEVICE", "cpu")
    settings = Settings()
    assert settings.database.url is not None
    assert (
        settings.database.url.get_secret_value(),
        settings.embedding.batch_size,
        settings.embedding.device,
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

    options = SearchOptions.from_settings(_ef_settings(monkeypatch).search)
    assert {s: options.ef_search_for(s) for s in DEFAULT_EF_SEARCH} == DEFAULT_EF_SEARCH


def test_one_ef_search_still_sets_every_storage_and_a_storage_setting_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ragservice.retrieval.options import SearchOptions

    settings = _ef_settings(monkeypatch, HNSW_EF_SEARCH="300", HNSW_EF_SEARCH_HALFVEC="60")
    assert settings.search.ef_search_by_storage() == {"float32": 300, "halfvec": 60, "binary": 300}
    options = SearchOptions.from_settings(settings.search)
    assert (options.ef_search_for("float32"), options.ef_search_for("halfvec")) == (300, 60)


def test_an_ef_search_given_for_a_search_wins_over_every_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dataclasses import replace

    from ragservice.errors import InvalidInputError
    from ragservice.retrieval.options import SearchOptions

    options = SearchOptions.from_settings(
        _ef_settings(monkeypatch, HNSW_EF_SEARCH_BINARY="70").search
    )
    given = replace(options, ef_search=25)
    assert [given.ef_search_for(s) for s in ("float32", "halfvec", "binary")] == [25, 25, 25]
    with pytest.raises(InvalidInputError):
        replace(options, ef_search=0)


def test_every_setting_is_in_exactly_one_group() -> None:
    owners: dict[str, list[str]] = {}
    for name, group in GROUPS.items():
        for field_name, field in group.model_fields.items():
            owners.setdefault(env_name(field_name, field), []).append(name)
    assert {name: groups for name, groups in owners.items() if len(groups) > 1} == {}
    assert list(owners) == list(FLAT_NAMES)
    assert not set(FLAT_NAMES) & set(GROUPS)  # a flat name never passes for a group's
    assert {name: field.annotation for name, field in Settings.model_fields.items()} == GROUPS


def test_groups_the_lead_relies_on_hold_their_subjects() -> None:
    fields = {
        name: {env_name(f, field) for f, field in group.model_fields.items()}
        for name, group in GROUPS.items()
    }
    named = set(FLAT_NAMES)
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
        assert group == kind.model_validate(
            {f: v for f, v in dict(group).items()}  # a group holds nothing but its fields
        )
    assert (settings.search.rrf_k, settings.search.bm25_k1) == (7, 1.5)
    assert (settings.cache.enabled, settings.limits.max_k) == (False, 50)


def test_groups_are_immutable_and_a_copy_changes_its_own() -> None:
    settings = Settings(search_rrf_k=7)
    assert settings.search is settings.search
    with pytest.raises(ValidationError, match="frozen"):
        settings.search.rrf_k = 8
    with pytest.raises(ValidationError, match="frozen"):
        settings.search = SearchSettings()
    changed = settings.model_copy(update={"search_rrf_k": 9, "max_k": 5})
    assert (changed.search.rrf_k, settings.search.rrf_k) == (9, 7)
    assert (changed.limits.max_k, settings.limits.max_k) == (5, 200)
    assert changed.cache is settings.cache  # the groups not named are shared, immutable
    assert settings == Settings(search_rrf_k=7) != changed
    assert changed == Settings(search_rrf_k=9, max_k=5)
    whole = settings.model_copy(update={"search": SearchSettings(bm25_k1=2.0)})
    assert (whole.search.bm25_k1, whole.search.rrf_k) == (2.0, 30)


def test_settings_hold_the_groups_alone() -> None:
    settings = Settings()
    assert list(Settings.model_fields) == list(GROUPS)
    flat = [name for name in FLAT_NAMES if hasattr(settings, name)]
    assert flat == []
    for group in GROUPS.values():
        assert [f for f in group.model_fields if hasattr(settings, f)] == []
    with pytest.raises(AttributeError):
        settings.data_dir  # type: ignore[attr-defined]  # noqa: B018
    with pytest.raises(ValidationError):
        settings.data_dir = Path("x")  # type: ignore[attr-defined]


def test_a_name_that_is_no_setting_is_refused() -> None:
    with pytest.raises(ValidationError, match="no setting is named 'search_rrf'"):
        Settings(search_rrf=3)
    with pytest.raises(ValueError, match="no setting is named 'rrf'"):
        Settings().model_copy(update={"rrf": 3})


def test_flat_names_and_groups_build_the_same_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGSERVICE_BM25_B", "0.5")
    by_name = Settings(search_rrf_k=7, bm25_k1=1.5)
    assert (by_name.search.rrf_k, by_name.search.bm25_k1, by_name.search.bm25_b) == (
        7,
        1.5,
        0.5,  # the environment still sets the group's other fields
    )
    given = Settings(search=SearchSettings(search_rrf_k=7))
    assert (given.search.rrf_k, given.search.bm25_b) == (7, 0.4)  # a group given is whole
    assert Settings(search={"search_rrf_k": 7}, bm25_k1=1.5).search == by_name.search


def test_the_variable_names_are_unchanged_in_the_environment_and_an_env_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("RAGSERVICE_SEARCH_RRF_K", "12")
    monkeypatch.setenv("RAGSERVICE_BM25_K1", "1.2")
    assert (Settings().search.rrf_k, Settings().search.bm25_k1) == (12, 1.2)
    monkeypatch.delenv("RAGSERVICE_SEARCH_RRF_K")
    monkeypatch.delenv("RAGSERVICE_BM25_K1")
    env_file = tmp_path / ".env"
    env_file.write_text("RAGSERVICE_SEARCH_RRF_K=13\nRAGSERVICE_CACHE_TTL_SECONDS=60\n")
    read = Settings(_env_file=env_file)
    assert (read.search.rrf_k, read.cache.ttl_seconds) == (13, 60)
    # As before, the service reads no .env of its own accord.
    monkeypatch.chdir(tmp_path)
    assert Settings().search.rrf_k == SearchSettings().rrf_k == 30


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


def test_every_variable_reaches_its_group_s_field(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in FLAT_NAMES:
        monkeypatch.setenv(f"RAGSERVICE_{name.upper()}", f"<{name}>")
    read = GroupedEnvironment(Settings, EnvSettingsSource(Settings))()
    # Each under its group, by its variable's name (the field's alias where it differs).
    assert {
        (group, name): value for group, values in read.items() for name, value in values.items()
    } == {(group, name): f"<{name}>" for name, (group, _) in FLAT_NAMES.items()}


def test_variables_are_parsed_and_checked_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGSERVICE_DATABASE_URL", "postgresql://rag:pw@db/rag")
    monkeypatch.setenv("RAGSERVICE_CACHE_ENABLED", "false")
    monkeypatch.setenv("ragservice_replicas", "eu=postgresql://r/db, us=postgresql://s/db")
    monkeypatch.setenv("RAGSERVICE_JWT_ALGORITHMS", "RS256,ES256")
    monkeypatch.setenv("RAGSERVICE_JWT_JWKS", " ")
    monkeypatch.setenv("RAGSERVICE_CHUNK_MAX_TOKENS", "128")
    settings = Settings()
    assert settings.database.url is not None
    assert settings.database.url.get_secret_value() == "postgresql://rag:pw@db/rag"
    assert settings.cache.enabled is False
    assert settings.replication.replica_urls() == [
        ("eu", "postgresql://r/db"),
        ("us", "postgresql://s/db"),
    ]
    assert settings.security.jwt_algorithm_names() == ("RS256", "ES256")
    assert settings.security.jwt_jwks is None
    assert settings.ingest.chunk_max_tokens == 128
    monkeypatch.setenv("RAGSERVICE_REPLICAS", "eu=mysql://r/db")
    with pytest.raises(ValidationError, match="not a PostgreSQL URL"):
        Settings()
    monkeypatch.delenv("RAGSERVICE_REPLICAS")
    monkeypatch.delenv("ragservice_replicas", raising=False)
    monkeypatch.setenv("RAGSERVICE_CHUNK_OVERLAP_TOKENS", "64")
    with pytest.raises(ValidationError, match="half the chunk size"):
        Settings()
    assert Settings(chunk_overlap_tokens=8).ingest.chunk_overlap_tokens == 8  # init wins


STEMS = {
    **{name: name for name in GROUPS},
    "replication": "replica",
    "embedding": "embed",
    "sources": "source",
    "indexing": "index",
    "answering": "answer",
    "limits": "limit",
    "jobs": "job",
}


def test_a_field_does_not_repeat_its_group_s_name() -> None:
    repeating = [
        f"{group}.{field}"
        for group, kind in GROUPS.items()
        for field in kind.model_fields
        if field.startswith(STEMS[group]) and field != "replicas"  # the replicas themselves
    ]
    assert repeating == []


def test_a_shortened_field_keeps_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGSERVICE_CACHE_ENABLED", "false")
    monkeypatch.setenv("RAGSERVICE_SEARCH_RRF_K", "12")
    monkeypatch.setenv("RAGSERVICE_INFERENCE_URL", "http://localhost:8080/v1")
    settings = Settings(cache_ttl_seconds=60)
    assert (settings.cache.enabled, settings.cache.ttl_seconds) == (False, 60)
    assert settings.search.rrf_k == 12
    assert settings.inference.url == "http://localhost:8080/v1"
    assert CacheSettings(enabled=False) == CacheSettings(cache_enabled=False)
    copied = settings.model_copy(update={"search_rrf_k": 5, "cache": CacheSettings(ttl_seconds=9)})
    assert (copied.search.rrf_k, copied.cache.ttl_seconds, copied.cache.enabled) == (5, 9, True)
    with pytest.raises(ValidationError, match="search_rrf_k"):
        Settings(search_rrf_k=0)  # the error names the variable's setting
