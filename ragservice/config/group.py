"""The base of every settings group: a small immutable pydantic model of one subject's fields."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class SettingsGroup(BaseModel):
    """One subject's settings. `Settings` inherits every group's fields (so each field keeps its
    `RAGSERVICE_<FIELD>` variable) and hands each group out whole (`settings.search`), so a module
    takes the group it needs rather than every setting of the service. A group built directly
    (`SearchSettings()`, in tests) holds its defaults: only `Settings` reads the environment.
    A new setting is a field of its subject's group, never of `Settings` itself."""

    model_config = ConfigDict(frozen=True)
