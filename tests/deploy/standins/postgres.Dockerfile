# Test-only stand-in for postgres:16 (built by tests/deploy/ensure-docker.sh only when the real
# image cannot be pulled): Debian bookworm's PostgreSQL 15, which Threadline supports as well.
FROM threadline-standin/base:bookworm

# Only the server binaries: the package's own cluster (15/main) is dropped, the entrypoint
# creates one in PGDATA like the official image.
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql-15 \
    && rm -rf /var/lib/apt/lists/* \
    && (pg_dropcluster --stop 15 main || true) \
    && mkdir -p /var/run/postgresql /var/lib/postgresql/data \
    && chown -R postgres:postgres /var/run/postgresql /var/lib/postgresql

COPY postgres-entrypoint.sh /usr/local/bin/docker-entrypoint.sh
ENV PATH=/usr/lib/postgresql/15/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PGDATA=/var/lib/postgresql/data
ENTRYPOINT ["/usr/local/bin/docker-entrypoint.sh"]
EXPOSE 5432
STOPSIGNAL SIGINT
CMD ["postgres"]
