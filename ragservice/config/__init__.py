"""Service configuration: environment variables prefixed `RAGSERVICE_`, read by `get_settings()`.

`Settings` is composed of small groups, one per subject (data.py, query.py, serving.py declare
them): it inherits every group's fields, so each keeps its variable `RAGSERVICE_<FIELD>` and
`settings.search_rrf_k` reads as before, and it hands each group out whole and immutable
(`settings.search`) for the modules that need that subject alone. docs/settings.md lists them,
written by `python -m ragservice.config.docs`.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from functools import lru_cache
from typing import Any, Self, TypeVar, cast

from pydantic import PrivateAttr
from pydantic_settings import BaseSettings, SettingsConfigDict

from ragservice.config.data import (
    DEFAULT_EMBEDDING_MODEL,
    DatabaseSettings,
    EmbeddingSettings,
    IndexSettings,
    IngestSettings,
    ReplicationSettings,
    parse_replicas,
)
from ragservice.config.group import SettingsGroup
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
    "GROUPS",
    "AnsweringSettings",
    "CacheSettings",
    "DatabaseSettings",
    "EmbeddingSettings",
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

G = TypeVar("G", bound=SettingsGroup)


# The groups last to first: pydantic takes the fields of the last base first, so the fields
# (a repr, a dump) come in GROUPS' order.
class Settings(
    ServerSettings,
    ObservabilitySettings,
    RetentionSettings,
    JobSettings,
    SecuritySettings,
    LimitSettings,
    CacheSettings,
    InferenceSettings,
    AnsweringSettings,
    SearchSettings,
    IndexSettings,
    SourceSettings,
    IngestSettings,
    EmbeddingSettings,
    ReplicationSettings,
    DatabaseSettings,
    BaseSettings,
):
    """Every setting of the service: the fields of all its groups (docs/settings.md)."""

    model_config = SettingsConfigDict(env_prefix="RAGSERVICE_", extra="ignore", frozen=False)

    # Each group built once from this object's values (already validated); emptied when a
    # field changes, and fresh in a copy.
    _groups: dict[type[SettingsGroup], SettingsGroup] = PrivateAttr(default_factory=dict)

    def group(self, kind: type[G]) -> G:
        """This object's values of one group's fields, as that group."""
        # The private dict itself: `self._groups` goes through pydantic's slow __getattr__.
        private = self.__pydantic_private__
        assert private is not None
        cache: dict[type[SettingsGroup], SettingsGroup] = private["_groups"]
        found = cache.get(kind)
        if found is None:
            values = {name: getattr(self, name) for name in kind.model_fields}
            found = cache[kind] = kind.model_construct(**values)
        return cast(G, found)

    @property
    def database(self) -> DatabaseSettings:
        return self.group(DatabaseSettings)

    @property
    def replication(self) -> ReplicationSettings:
        return self.group(ReplicationSettings)

    @property
    def embedding(self) -> EmbeddingSettings:
        return self.group(EmbeddingSettings)

    @property
    def ingest(self) -> IngestSettings:
        return self.group(IngestSettings)

    @property
    def sources(self) -> SourceSettings:
        return self.group(SourceSettings)

    @property
    def indexing(self) -> IndexSettings:
        return self.group(IndexSettings)

    @property
    def search(self) -> SearchSettings:
        return self.group(SearchSettings)

    @property
    def answering(self) -> AnsweringSettings:
        return self.group(AnsweringSettings)

    @property
    def inference(self) -> InferenceSettings:
        return self.group(InferenceSettings)

    @property
    def cache(self) -> CacheSettings:
        return self.group(CacheSettings)

    @property
    def limits(self) -> LimitSettings:
        return self.group(LimitSettings)

    @property
    def security(self) -> SecuritySettings:
        return self.group(SecuritySettings)

    @property
    def jobs(self) -> JobSettings:
        return self.group(JobSettings)

    @property
    def retention(self) -> RetentionSettings:
        return self.group(RetentionSettings)

    @property
    def observability(self) -> ObservabilitySettings:
        return self.group(ObservabilitySettings)

    @property
    def server(self) -> ServerSettings:
        return self.group(ServerSettings)

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name in type(self).model_fields:
            self._groups = {}

    def __eq__(self, other: object) -> bool:
        # The fields alone: pydantic would compare the cached groups too.
        if not isinstance(other, Settings):
            return NotImplemented
        return type(self) is type(other) and self.__dict__ == other.__dict__

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        copied = super().model_copy(update=update, deep=deep)
        copied._groups = {}
        return copied


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
