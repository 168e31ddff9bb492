#!/usr/bin/env bash
# Streaming replication on the primary, for docker-compose.yml.
#
# The official image's entrypoint runs this once, when the data directory is still empty
# (sourced, or executed when the file is executable), while a socket-only server is up.
# It creates the replication role and lets it connect for replication with its password:
# pg_hba.conf's "host all all all ..." line that the entrypoint writes does not cover
# replication connections ("all" in the database column never matches "replication").
set -e

: "${REPLICATION_USER:=replicator}"
: "${REPLICATION_PASSWORD:?set REPLICATION_PASSWORD for the replication role}"

psql -v ON_ERROR_STOP=1 --no-psqlrc --no-password \
    --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
    --set repl_user="$REPLICATION_USER" --set repl_password="$REPLICATION_PASSWORD" <<'EOSQL'
CREATE ROLE :"repl_user" WITH REPLICATION LOGIN PASSWORD :'repl_password';
EOSQL

printf 'host replication %s all scram-sha-256\n' "$REPLICATION_USER" >> "$PGDATA/pg_hba.conf"
