"""API keys: how they look, how they are hashed. Pure functions; the store keeps only hashes."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from enum import StrEnum

KEY_PREFIX = "rsk_"
_PUBLIC_CHARS = 8  # shown in listings so a key can be recognised without revealing it


class Role(StrEnum):
    """What a key may do; each role includes the ones before it."""

    READER = "reader"
    WRITER = "writer"
    ADMIN = "admin"

    def allows(self, needed: Role) -> bool:
        order = list(Role)
        return order.index(self) >= order.index(needed)


@dataclass(frozen=True, slots=True)
class NewKey:
    """A freshly made key: `secret` is shown once and never stored."""

    secret: str
    prefix: str
    hash: str


def new_key() -> NewKey:
    """A random key with 256 bits of entropy, e.g. `rsk_3q2V…`."""
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    return NewKey(secret=secret, prefix=public_prefix(secret), hash=hash_key(secret))


def hash_key(secret: str) -> str:
    """SHA-256 of the key. Keys are random, not passwords, so a fast hash is enough."""
    return hashlib.sha256(secret.encode()).hexdigest()


def public_prefix(secret: str) -> str:
    return secret[: len(KEY_PREFIX) + _PUBLIC_CHARS]
