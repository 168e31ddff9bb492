#!/usr/bin/env bash
# The service's own login, for docker-compose.yml.
#
# The official image's entrypoint runs this once, when the data directory is still empty.
# POSTGRES_USER (a superuser) owns the schema and runs the migrations (the `migrate` service);
# the app logs in as SERVICE_USER: no superuser, no BYPASSRLS, not the tables' owner, a member
# of the two roles it works as. Row-level security binds both roles (migrations 0007, 0010), and
# the login can RESET ROLE only to itself, which may read nothing of its own.
# The migrations create the roles too when they are missing; here they must exist first so
# the login can be granted them.
set -e

: "${SERVICE_USER:=ragservice_app}"
: "${SERVICE_PASSWORD:?set SERVICE_PASSWORD for the service login}"

psql -v ON_ERROR_STOP=1 --no-psqlrc --no-password \
    --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
    --set service_user="$SERVICE_USER" --set service_password="$SERVICE_PASSWORD" <<'EOSQL'
CREATE ROLE ragservice_service NOLOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE;
CREATE ROLE ragservice_system NOLOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE;
GRANT ragservice_service TO ragservice_system;
CREATE ROLE :"service_user" WITH LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE
    PASSWORD :'service_password';
GRANT ragservice_service, ragservice_system TO :"service_user";
EOSQL
