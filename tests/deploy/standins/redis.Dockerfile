# Test-only stand-in for redis:7 (built by tests/deploy/ensure-docker.sh only when the real image
# cannot be pulled): Debian bookworm's redis-server 7.0 and redis-cli.
FROM threadline-standin/base:bookworm

RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends redis-server \
    && rm -rf /var/lib/apt/lists/*

# Like the official image: without a configuration file redis-server would refuse clients from
# other containers (protected mode), so the entrypoint turns protected mode off.
COPY redis-entrypoint.sh /usr/local/bin/docker-entrypoint.sh
ENTRYPOINT ["/usr/local/bin/docker-entrypoint.sh"]
EXPOSE 6379
CMD ["redis-server"]
