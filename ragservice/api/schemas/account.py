"""Who the caller is and what the server allows it: what a console needs before its first page."""

from __future__ import annotations

import uuid

from pydantic import BaseModel, Field

from ingest.loaders.formats import CitationUnit, Format, Limit
from ragservice.auth.keys import Role


class TenantOut(BaseModel):
    id: uuid.UUID
    name: str


class MeOut(BaseModel):
    tenant: TenantOut
    role: Role = Field(description="`reader`, `writer` or `admin`")
    auth_disabled: bool = Field(description="true: every request is the default tenant's admin")
    service_admin: bool = Field(
        description="an admin of the default tenant (or auth is off): the only callers who may "
        "switch the embedding model, which every tenant shares"
    )
    key_prefix: str | None = Field(description="the first characters of the key; null: no key")
    user: str | None = Field(
        default=None, description="the user the key or token acts for; null: none"
    )
    readers: list[str] | None = Field(
        default=None,
        description="the principals whose documents you read (your user and groups); null: "
        "every document of the tenant (docs/permissions.md)",
    )
    max_file_bytes: int = Field(description="the largest file an upload may carry")
    max_files_per_upload: int
    cache_enabled: bool = Field(description="whether the semantic prompt cache is on")
    answer_model: str = Field(description="the upstream model answers come from, or `extractive`")


class FormatOut(BaseModel):
    kind: str = Field(description="its name in a document's metadata (`file_type`): `pdf`, `image`")
    suffixes: list[str] = Field(description="the file name suffixes that pick it: `.jpg`, `.jpeg`")
    mime_types: list[str]
    citation: CitationUnit | None = Field(
        description="what a citation names in it: `page`, `slide`, `sheet` or `row`; null: none"
    )
    extra: str | None = Field(
        description="the optional part of the install it needs (`pip install "
        "'ragservice[EXTRA]'`); null: none"
    )
    limits: list[Limit] = Field(
        description="`pages`: its pages, slides, sheets or frames count against the page limit; "
        "`zip`: refused when it looks like a zip bomb"
    )


class FormatsOut(BaseModel):
    formats: list[FormatOut]
    suffixes: list[str] = Field(description="every suffix an upload may have, in order")


def formats_out(formats: tuple[Format, ...]) -> FormatsOut:
    """The view of the loaders' formats a client (the console) chooses files by."""
    return FormatsOut(
        formats=[
            FormatOut(
                kind=f.kind,
                suffixes=list(f.suffixes),
                mime_types=list(f.mime_types),
                citation=f.citation,
                extra=f.extra,
                limits=list(f.limits),
            )
            for f in formats
        ],
        suffixes=[s for f in formats for s in f.suffixes],
    )
