"""Service configuration: environment variables prefixed `RAGSERVICE_`, read by `get_settings()`.

`Settings` is made of small immutable groups, one per subject (data.py, query.py, serving.py,
sources.py declare them), and holds nothing else: a module reads `settings.search.bm25_k1`, and
one that needs a single subject takes that group (`SearchSettings`), not every setting. Each
setting keeps its variable `RAGSERVICE_<NAME>`. docs/settings.md lists them, written by
`python -m ragservice.config.docs`.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from functools import lru_cache
from typing import Any, Self

from pydantic import Field, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from ragservice.config.data import (
    DEFAULT_EMBEDDING_MODEL,
    DatabaseSettings,
    EmbeddingSettings,
    IndexSettings,
    IngestSettings,
    ReplicationSettings,
    parse_replicas,
)
from ragservice.config.group import PREFIX, SettingsGroup, env_name
from ragservice.config.query import (
    DEFAULT_EF_SEARCH,
    AnsweringSettings,
    CacheSettings,
    InferenceSettings,
    SearchSettings,
)
from ragservice.config.serving import (
    JobSettings,
    LimitSettings,
    ObservabilitySettings,
    RetentionSettings,
    SecuritySettings,
    ServerSettings,
)
from ragservice.config.sources import SourceSettings

__all__ = [
    "DEFAULT_EF_SEARCH",
    "DEFAULT_EMBEDDING_MODEL",
    "DEFAULT_TENANT_ID",
    "DEFAULT_TENANT_NAME",
    "FLAT_NAMES",
    "GROUPS",
    "PREFIX",
    "AnsweringSettings",
    "CacheSettings",
    "DatabaseSettings",
    "EmbeddingSettings",
    "GroupedEnvironment",
    "IndexSettings",
    "InferenceSettings",
    "IngestSettings",
    "JobSettings",
    "LimitSettings",
    "ObservabilitySettings",
    "ReplicationSettings",
    "RetentionSettings",
    "SearchSettings",
    "SecuritySettings",
    "ServerSettings",
    "Settings",
    "SettingsGroup",
    "SourceSettings",
    "env_name",
    "get_settings",
    "is_loopback",
    "parse_replicas",
]

DEFAULT_TENANT_ID = "00000000-0000-0000-0000-000000000001"
DEFAULT_TENANT_NAME = "default"
"""The name of tenant `DEFAULT_TENANT_ID` (migration 0001): the CLI's tenant unless told."""

GROUPS: dict[str, type[SettingsGroup]] = {
    "database": DatabaseSettings,
    "replication": ReplicationSettings,
    "embedding": EmbeddingSettings,
    "ingest": IngestSettings,
    "sources": SourceSettings,
    "indexing": IndexSettings,
    "search": SearchSettings,
    "answering": AnsweringSettings,
    "inference": InferenceSettings,
    "cache": CacheSettings,
    "limits": LimitSettings,
    "security": SecuritySettings,
    "jobs": JobSettings,
    "retention": RetentionSettings,
    "observability": ObservabilitySettings,
    "server": ServerSettings,
}
"""Every group by its attribute on `Settings`, in the order docs/settings.md lists them."""

FLAT_NAMES: dict[str, tuple[str, str]] = {
    env_name(field_name, field): (group_name, field_name)
    for group_name, group in GROUPS.items()
    for field_name, field in group.model_fields.items()
}
"""Each setting by its variable's name without the prefix (`search_rrf_k` for
`RAGSERVICE_SEARCH_RRF_K`): its group's attribute on `Settings`, and its field in that group."""


class GroupedEnvironment(PydanticBaseSettingsSource):
    """The variables `RAGSERVICE_<NAME>` that a source (the environment, an env file) holds,
    each in its group: `{"search": {"search_rrf_k": "12"}}`. A value is prepared as the source
    prepares it for a field of its own (case-insensitive names, JSON for complex types)."""

    def __init__(self, settings_cls: type[BaseSettings], source: EnvSettingsSource) -> None:
        super().__init__(settings_cls)
        self.source = source

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ reads every group at once

    def __call__(self) -> dict[str, Any]:
        found: dict[str, Any] = {}
        variables = self.source.env_vars
        for name, (group_name, field_name) in FLAT_NAMES.items():
            variable = f"{PREFIX}{name}"
            raw = variables.get(variable if self.source.case_sensitive else variable.lower())
            if raw is None:
                continue
            field = GROUPS[group_name].model_fields[field_name]
            value = self.source.prepare_field_value(field_name, field, raw, False)
            found.setdefault(group_name, {})[name] = value  # by its variable's name, as errors say
        return found


def grouped(values: Mapping[str, Any]) -> dict[str, Any]:
    """`values` by group: a group's name keeps its value (a group, or a mapping of its fields),
    a setting's flat name (`search_rrf_k`) joins its group's values under that name (which the
    group's field accepts as its alias); any other name is an error."""
    out: dict[str, Any] = {}
    flat: dict[str, dict[str, Any]] = {}
    for name, value in values.items():
        if name in GROUPS:
            out[name] = value
        elif name in FLAT_NAMES:
            flat.setdefault(FLAT_NAMES[name][0], {})[name] = value
        else:
            raise ValueError(
                f"no setting is named {name!r} (a group of `Settings`, or the name of a "
                f"{PREFIX}* variable without its prefix)"
            )
    for group_name, named in flat.items():
        given = out.get(group_name, {})
        if isinstance(given, SettingsGroup):
            given = {
                env_name(f, field): getattr(given, f) for f, field in given.model_fields.items()
            }
        out[group_name] = {**given, **named}
    return out


# The groups in GROUPS' order (the order docs/settings.md lists them); each is built from the
# variables of its fields alone (GroupedEnvironment), never from `RAGSERVICE_<GROUP>__...`.
class Settings(BaseSettings):
    """Every setting of the service, one attribute per group (`settings.search.bm25_k1`).
    Built from the environment (`RAGSERVICE_<NAME>`, docs/settings.md), or from flat names
    (`Settings(bm25_k1=1.2)`, `settings.model_copy(update={"bm25_k1": 1.2})`), or groups."""

    model_config = SettingsConfigDict(env_prefix=PREFIX, extra="forbid", frozen=True)

    database: DatabaseSettings = Field(default_factory=DatabaseSettings)
    replication: ReplicationSettings = Field(default_factory=ReplicationSettings)
    embedding: EmbeddingSettings = Field(default_factory=EmbeddingSettings)
    ingest: IngestSettings = Field(default_factory=IngestSettings)
    sources: SourceSettings = Field(default_factory=SourceSettings)
    indexing: IndexSettings = Field(default_factory=IndexSettings)
    search: SearchSettings = Field(default_factory=SearchSettings)
    answering: AnsweringSettings = Field(default_factory=AnsweringSettings)
    inference: InferenceSettings = Field(default_factory=InferenceSettings)
    cache: CacheSettings = Field(default_factory=CacheSettings)
    limits: LimitSettings = Field(default_factory=LimitSettings)
    security: SecuritySettings = Field(default_factory=SecuritySettings)
    jobs: JobSettings = Field(default_factory=JobSettings)
    retention: RetentionSettings = Field(default_factory=RetentionSettings)
    observability: ObservabilitySettings = Field(default_factory=ObservabilitySettings)
    server: ServerSettings = Field(default_factory=ServerSettings)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        assert isinstance(env_settings, EnvSettingsSource)
        assert isinstance(dotenv_settings, EnvSettingsSource)
        return (
            init_settings,
            GroupedEnvironment(settings_cls, env_settings),
            GroupedEnvironment(settings_cls, dotenv_settings),
        )

    @model_validator(mode="before")
    @classmethod
    def _flat_names_join_their_groups(cls, data: Any) -> Any:
        return grouped(data) if isinstance(data, Mapping) else data

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy with `update` applied, by group or by flat name (not validated, as pydantic's)."""
        if not update:
            return super().model_copy(deep=deep)
        changes = grouped(update)
        for name, change in changes.items():
            if isinstance(change, dict):  # values of the group's fields, over this object's group
                fields = {
                    FLAT_NAMES[key][1] if key in FLAT_NAMES else key: v for key, v in change.items()
                }
                changes[name] = getattr(self, name).model_copy(update=fields)
        return super().model_copy(update=changes, deep=deep)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings, read from the environment once."""
    return Settings()


def is_loopback(host: str) -> bool:
    """Whether `host` names this machine only (`localhost`, 127.0.0.0/8, ::1): where a server
    may run without authentication and plain http may carry a key."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
