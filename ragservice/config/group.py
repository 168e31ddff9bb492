"""The base of every settings group: a small immutable pydantic model of one subject's fields."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic.fields import FieldInfo

PREFIX = "RAGSERVICE_"
"""The prefix of every setting's environment variable."""


class SettingsGroup(BaseModel):
    """One subject's settings, an attribute of `Settings` (`settings.search`), so a module takes
    the group it needs rather than every setting of the service. Each field is read from
    `RAGSERVICE_<NAME>` (`env_name`); a field does not repeat its group's name, and where the
    variable does, the field's validation alias keeps it (`settings.cache.enabled` is
    `RAGSERVICE_CACHE_ENABLED`, and `CacheSettings(cache_enabled=...)` is still accepted).
    A group built directly (`SearchSettings()`, in tests) holds its defaults: only `Settings`
    reads the environment. A new setting is a field of its subject's group, never of `Settings`
    itself."""

    # Defaults validated too, as pydantic-settings validates those of `Settings`.
    model_config = ConfigDict(frozen=True, validate_default=True, validate_by_name=True)


def env_name(field_name: str, field: FieldInfo) -> str:
    """The name a field goes by outside its group: its variable's, without `RAGSERVICE_`
    (`search_rrf_k`), and a flat keyword of `Settings(...)`. The field's validation alias
    where it has one (`rrf_k` of the search group is `search_rrf_k`), else its own name."""
    alias = field.validation_alias
    return alias if isinstance(alias, str) else field_name
