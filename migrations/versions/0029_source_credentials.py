"""Sources keep their credentials apart from their location.

- `sources.credentials` (JSONB, `{"username": …, "password": …}`): what a source is read
  with (HTTP Basic for a web site, an access key id and secret key for S3). It is used to
  fetch and never shown; the location is stored and shown without them.
- The upgrade splits the user information (`https://user:pass@host/…`) off the locations that
  hold some into `credentials`. Where the location without it is taken already in the same
  collection (a source with credentials and one without, at one URL), the split one's location
  gets a fragment, `#2` (a crawl drops fragments; an S3 prefix does not read them).
- The downgrade puts the credentials back into the locations (percent-encoded), as the code
  before this revision reads them, and drops the column.

Revision ID: 0029
Revises: 0028
Create Date: 2027-06-08
"""

from __future__ import annotations

from urllib.parse import quote, unquote, urlsplit, urlunsplit

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None

_WITH_USERINFO = sa.text(
    "SELECT id, collection_id, location FROM sources "
    "WHERE location ~* '^(https?|s3)://[^/?#]*@' ORDER BY created_at, id"
)
_TAKEN = sa.text(
    "SELECT 1 FROM sources WHERE collection_id = :collection_id AND location = :location"
)
_SPLIT = sa.text(
    "UPDATE sources SET location = :location, credentials = CAST(:credentials AS jsonb) "
    "WHERE id = :id"
)
_WITH_CREDENTIALS = sa.text(
    "SELECT id, collection_id, location, credentials FROM sources "
    "WHERE jsonb_typeof(credentials) = 'object'"
)
_JOINED = sa.text("UPDATE sources SET location = :location WHERE id = :id")


def _split(location: str) -> tuple[str, dict[str, str] | None]:
    parts = urlsplit(location)
    userinfo, _, host = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    clean = urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
    if not user and not password:
        return clean, None
    return clean, {"username": unquote(user), "password": unquote(password)}


def _joined(location: str, credentials: dict[str, str]) -> str:
    parts = urlsplit(location)
    userinfo = quote(str(credentials.get("username") or ""), safe="")
    if credentials.get("password"):
        userinfo += ":" + quote(str(credentials["password"]), safe="")
    netloc = f"{userinfo}@{parts.netloc}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _free(conn: sa.Connection, collection_id: object, location: str) -> bool:
    found = conn.execute(_TAKEN, {"collection_id": collection_id, "location": location})
    return found.first() is None


def upgrade() -> None:
    import json

    op.add_column("sources", sa.Column("credentials", postgresql.JSONB(), nullable=True))
    conn = op.get_bind()
    for source_id, collection_id, location in conn.execute(_WITH_USERINFO).all():
        clean, credentials = _split(location)
        unique, n = clean, 1
        while not _free(conn, collection_id, unique):
            n += 1
            unique = f"{clean}#{n}"
        values = {
            "id": source_id,
            "location": unique,
            "credentials": None if credentials is None else json.dumps(credentials),
        }
        conn.execute(_SPLIT, values)


def downgrade() -> None:
    conn = op.get_bind()
    for source_id, collection_id, location, credentials in conn.execute(_WITH_CREDENTIALS).all():
        joined = _joined(location, credentials)
        if _free(conn, collection_id, joined):
            conn.execute(_JOINED, {"id": source_id, "location": joined})
    op.drop_column("sources", "credentials")
