"""A source's credentials: the user name and password a web site asks for (HTTP Basic), or the
access key id and secret key of an S3 bucket.

They may be given in the location's user information (`https://user:pass@host/…`,
`s3://KEY:SECRET@bucket/prefix`) or apart from it; either way they are split off the location
when the source is added (`split_location`) and kept apart from it: the location is stored and
shown without them, and the credentials are never shown again (no answer, command output, audit
entry, job or log line names them). A reader uses them when it fetches, and only from the
source's own host (`same_origin`): a redirect or a sitemap that leads elsewhere is fetched
without them. `redact` takes them, and any URL's user information, out of a message that could
hold them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from ingest.sources.weblinks import normalise

MIN_REDACTED_CHARS = 3
"""Shorter secrets are not looked for in messages (a one-letter password would star every
word); they cannot appear in a location either, which is stored without them."""

_SCHEMES = ("http", "https", "s3")
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/?#\s'\"]*@")


@dataclass(frozen=True, slots=True)
class Credentials:
    """A user name (or access key id) and a password (or secret key); either may be empty,
    not both. Its repr names neither."""

    username: str
    password: str = ""

    def __repr__(self) -> str:
        return "Credentials(***)"

    def as_pair(self) -> tuple[str, str]:
        return self.username, self.password

    def as_json(self) -> dict[str, str]:
        """As the store keeps them (`sources.credentials`)."""
        return {"username": self.username, "password": self.password}

    @classmethod
    def from_json(cls, value: Mapping[str, Any] | None) -> Credentials | None:
        if not value:
            return None
        return cls(str(value.get("username") or ""), str(value.get("password") or ""))

    def secrets(self) -> tuple[str, ...]:
        """What must not be shown: the password, and the user name too when there is no
        password (a token given as the user name, `https://TOKEN@host/`)."""
        found = [self.password] if self.password else [self.username]
        return tuple(s for s in found if len(s) >= MIN_REDACTED_CHARS)


def split_location(location: str) -> tuple[str, Credentials | None]:
    """`location` without its user information, and the credentials that were in it (None
    when it had none). Only http(s) and s3 locations are split; a folder path is as it is."""
    try:
        parts = urlsplit(location)
    except ValueError:  # e.g. a broken IPv6 literal: nothing to read credentials from
        return redact(location), None
    if parts.scheme.lower() not in _SCHEMES or "@" not in parts.netloc:
        return location, None
    userinfo, _, host = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    clean = urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
    if not user and not password:
        return clean, None
    return clean, Credentials(unquote(user), unquote(password))


def has_userinfo(url: str) -> bool:
    """Whether `url` holds user information (`scheme://…@host`)."""
    return _USERINFO.search(url) is not None


def redact(text: str, credentials: Credentials | None = None) -> str:
    """`text` with the user information of any URL in it, and the credentials' secrets,
    replaced by `***`."""
    text = _USERINFO.sub(r"\1***@", text)
    for secret in credentials.secrets() if credentials is not None else ():
        text = text.replace(secret, "***")
    return text


def same_origin(url: str, root: str) -> bool:
    """Whether `url` is on the origin (scheme, host and port) `root` (a `Site.root`) names:
    where a source's credentials may be sent."""
    found = normalise(url)
    if found is None:
        return False
    parts = urlsplit(found)
    return f"{parts.scheme}://{parts.netloc}" == root
