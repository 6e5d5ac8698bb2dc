# Test-only stand-in for python:3.11-slim (built by tests/deploy/ensure-docker.sh only when the
# real image cannot be pulled): Debian bookworm's Python 3.11 in a venv that is first on PATH, so
# `python` and `pip install` behave as in the official image.
FROM threadline-standin/base:bookworm

RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
       python3 python3-venv \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/python

# The build machine's CA bundle and pip index settings: pip inside image builds must reach the
# same package index the machine does (possibly through a TLS-inspecting proxy).
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY pip.conf /etc/pip.conf

ENV PATH=/opt/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    LANG=C.UTF-8

CMD ["python3"]
