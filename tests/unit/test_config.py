"""Settings come from RAGSERVICE_* variables; chunking settings are checked against the model."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from ragservice.config import DEFAULT_EMBEDDING_MODEL, Settings, get_settings
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
    assert settings.replica_urls() == [("eu", "postgresql://rag:pw-2@replica/rag")]


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
    assert chunking_options(Settings(), 254).max_tokens == 254
    assert chunking_options(Settings(chunk_max_tokens=128), 254).max_tokens == 128
    with pytest.raises(ConfigurationError, match="exceeds"):
        chunking_options(Settings(chunk_max_tokens=512), 254)
    with pytest.raises(ConfigurationError, match="overlap"):
        chunking_options(Settings(chunk_overlap_tokens=200), 254)


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
    assert settings.ef_search_by_storage() == {"float32": 300, "halfvec": 60, "binary": 300}
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
