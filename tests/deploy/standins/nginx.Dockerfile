# Test-only stand-in for nginx:1.27 (built by tests/deploy/ensure-docker.sh only when the real
# image cannot be pulled): Debian bookworm's nginx, in the foreground, logging to the container.
FROM threadline-standin/base:bookworm

RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends nginx-light \
    && rm -rf /var/lib/apt/lists/* \
    && ln -sf /dev/stdout /var/log/nginx/access.log \
    && ln -sf /dev/stderr /var/log/nginx/error.log

EXPOSE 80
STOPSIGNAL SIGQUIT
CMD ["nginx", "-g", "daemon off;"]
