"""Who may read a document: principals (`user:<name>`, `group:<name>`) and reader lists.

A document's readers are a list of principals; no list means the whole tenant. An asker's
principal set is its user and that user's groups; a document is readable when its list is
empty or shares a principal with the set. Pure functions; the database enforces the lists
(migration 0026, `ragservice.db.tenancy`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from ragservice.errors import InvalidInputError

USER = "user"
GROUP = "group"
KEY = "key"
"""A transaction's principal set also names the asker's API key (`key:<prefix>`), so that what
it queued is its own (a job); no document lists a key among its readers."""
MAX_NAME_CHARS = 128
MAX_READERS = 256
"""Principals one document may list (a larger audience is a group)."""

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+\-_]{0,127}")
"""Matched whole (`fullmatch`): `$` would let a trailing newline through."""


def check_name(name: str, what: str = "name") -> str:
    """A user or group name: letters, digits and `._@+-_`, at most 128 characters."""
    if not _NAME.fullmatch(name):
        raise InvalidInputError(
            f"{what} {name[:40]!r}: use 1-{MAX_NAME_CHARS} letters, digits and ._@+-_ "
            "(starting with a letter or digit)"
        )
    return name


def principal(kind: str, name: str) -> str:
    return f"{kind}:{check_name(name, kind)}"


def parse_principal(text: str) -> str:
    """`user:ana` or `group:hr` (spaces around are dropped), checked."""
    kind, sep, name = text.strip().partition(":")
    if not sep or kind not in (USER, GROUP):
        raise InvalidInputError(f"reader {text.strip()[:40]!r}: write user:<name> or group:<name>")
    return principal(kind, name.strip())


def parse_readers(value: str | Iterable[str] | None) -> tuple[str, ...] | None:
    """A reader list from `group:hr,user:ana` or a list of such strings: checked, without
    duplicates, sorted. None stays None (not given); an empty list is `()` (the whole tenant)."""
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else list(value)
    readers = sorted({parse_principal(item) for item in items if item.strip()})
    if len(readers) > MAX_READERS:
        raise InvalidInputError(
            f"{len(readers)} readers; at most {MAX_READERS} per document (use a group)"
        )
    return tuple(readers)


def principal_set(
    user: str | None, groups: Iterable[str] = (), *, key_prefix: str | None = None
) -> frozenset[str]:
    """The principals an asker reads as: its user and its groups (and its key, which no
    document lists: it names what the key itself queued)."""
    found = {principal(GROUP, g) for g in groups}
    if user is not None:
        found.add(principal(USER, user))
    if key_prefix is not None:
        found.add(principal(KEY, key_prefix))
    return frozenset(found)


def may_read(principals: frozenset[str] | None, readers: Sequence[str] | None) -> bool:
    """Whether the principal set (None: every document) may read a document of `readers`
    (None or empty: the whole tenant's), as the row-level security policies decide."""
    return principals is None or not readers or not principals.isdisjoint(readers)


def listable(principals: Iterable[str]) -> list[str]:
    """The principals a document may list (users and groups, not keys), sorted: what decides
    which documents an asker reads."""
    return sorted(p for p in principals if not p.startswith(f"{KEY}:"))


def array_literal(principals: Iterable[str]) -> str:
    """A PostgreSQL text[] literal of checked principals (`{"user:ana","group:hr"}`); the
    names' characters never need escaping."""
    return "{" + ",".join(f'"{_checked(p)}"' for p in sorted(principals)) + "}"


def _checked(text: str) -> str:
    kind, _, name = text.partition(":")
    return parse_principal(text) if kind != KEY else principal(KEY, name)
