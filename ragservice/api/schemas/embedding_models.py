"""The embedding model versions, as `ragservice models list --json` shows them (less the path)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from ragservice.api.schemas.common import Text


class HeldOutOut(BaseModel):
    before: dict[str, Any] = Field(description="the base model's held-out figures, e.g. ndcg@10")
    after: dict[str, Any] = Field(description="this version's, on the same held-out questions")


class ModelOut(BaseModel):
    id: int
    name: str
    version: int
    dimension: int
    storage: str = Field(description="how its chunk vectors are kept: float32, halfvec, binary")
    active: bool = Field(description="the model every server serves")
    embedded: int = Field(description="chunks that have an embedding of this model")
    chunks: int = Field(description="chunks in all (see the docs for whose)")
    base: str | None = Field(description="`NAME:VERSION` it was fine-tuned from")
    created: str = Field(description="when it was registered (ISO 8601, to the second)")
    held_out: HeldOutOut


class ModelsOut(BaseModel):
    models: list[ModelOut]
    can_switch: bool = Field(
        description="whether this key may activate a model or roll back (`service_admin`)"
    )


class ActivateIn(BaseModel):
    model: Text = Field(
        min_length=1, max_length=300, description="NAME[:VERSION] (default: the latest version)"
    )
    force: bool = Field(default=False, description="even when chunks lack its embeddings")


class RollbackIn(BaseModel):
    force: bool = Field(default=False, description="even when chunks lack its embeddings")


class SwitchOut(BaseModel):
    model: ModelOut = Field(description="the model active now")
    changed: bool = Field(description="false: it was already the active model")
    previous_id: int | None = Field(description="the model it replaced")
