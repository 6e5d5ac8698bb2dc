#!/bin/sh
# Stand-in for the official postgres image's entrypoint: on an empty PGDATA, create a cluster
# whose superuser is POSTGRES_USER (password POSTGRES_PASSWORD) with database POSTGRES_DB,
# accepting password logins from the container network; then run the server as postgres.
set -e
: "${POSTGRES_USER:=postgres}"
: "${POSTGRES_DB:=$POSTGRES_USER}"
as_postgres() { setpriv --reuid=postgres --regid=postgres --init-groups "$@"; }

if [ "$1" = "postgres" ]; then
    mkdir -p "$PGDATA" /var/run/postgresql
    chown postgres:postgres "$PGDATA" /var/run/postgresql
    chmod 700 "$PGDATA"
    if [ ! -s "$PGDATA/PG_VERSION" ]; then
        pwfile=$(mktemp)
        printf '%s\n' "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD is required}" > "$pwfile"
        chown postgres "$pwfile"
        as_postgres initdb --username="$POSTGRES_USER" --pwfile="$pwfile" \
            --auth-local=trust --auth-host=scram-sha-256 -D "$PGDATA" >/dev/null
        rm -f "$pwfile"
        echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
        if [ "$POSTGRES_DB" != "postgres" ]; then
            # A private server on the socket only, to create the database before listening.
            as_postgres pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
            as_postgres psql -v ON_ERROR_STOP=1 -U "$POSTGRES_USER" -d postgres \
                -c "CREATE DATABASE \"$POSTGRES_DB\"" >/dev/null
            as_postgres pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
        fi
    fi
    shift
    exec setpriv --reuid=postgres --regid=postgres --init-groups \
        postgres -c listen_addresses='*' "$@"
fi
exec "$@"
