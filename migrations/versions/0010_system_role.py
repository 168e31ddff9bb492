"""Cross-tenant access is a role, not a setting any session may change.

Until now a transaction saw every tenant's rows when it set `ragservice.system = on`, a setting
any session may set. It now needs to work as the `ragservice_system` role (`SET LOCAL ROLE`),
which only a login granted that role may do: the service's own login (the migrating user when
it is not a superuser; a dedicated login such as compose's `ragservice_app` otherwise, see
docs/operators.md#tenant-isolation). `ragservice_system` is bound by row-level security like
`ragservice_service` (no BYPASSRLS, not the tables' owner); the policies let it see every row.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03
"""

from __future__ import annotations

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

SERVICE_ROLE = "ragservice_service"
SYSTEM_ROLE = "ragservice_system"

_ROLE = f"""
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{SYSTEM_ROLE}') THEN
        IF NOT EXISTS (SELECT 1 FROM pg_roles
                       WHERE rolname = current_user AND (rolsuper OR rolcreaterole)) THEN
            RAISE WARNING 'role {SYSTEM_ROLE} not created: % may not create roles', current_user;
            RETURN;
        END IF;
        CREATE ROLE {SYSTEM_ROLE} NOLOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{SERVICE_ROLE}')
       AND NOT pg_has_role('{SYSTEM_ROLE}', '{SERVICE_ROLE}', 'MEMBER') THEN
        -- the same privileges as the service role: only the policies tell them apart
        GRANT {SERVICE_ROLE} TO {SYSTEM_ROLE};
    END IF;
    IF NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
       AND NOT pg_has_role(current_user, '{SYSTEM_ROLE}', 'MEMBER') THEN
        EXECUTE format('GRANT {SYSTEM_ROLE} TO %I', current_user);
    END IF;
END $$
"""

# The policies of 0007 call this function; `current_user` is the role the statement runs as.
_ALL_TENANTS = f"""
CREATE OR REPLACE FUNCTION ragservice_all_tenants() RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT current_user = '{SYSTEM_ROLE}'
$$
"""

_ALL_TENANTS_BEFORE = """
CREATE OR REPLACE FUNCTION ragservice_all_tenants() RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT coalesce(current_setting('ragservice.system', true), '') = 'on'
$$
"""


def upgrade() -> None:
    op.execute(_ROLE)
    op.execute(_ALL_TENANTS)


def downgrade() -> None:
    # The role stays (cluster-wide: other databases on the server may use it).
    op.execute(_ALL_TENANTS_BEFORE)
