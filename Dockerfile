# Threadline server image: `threadline serve --role all|gateway|worker`, `threadline migrate`,
# `threadline token create`. Used by docker-compose.yml for the scale-out deployment.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# Third-party dependencies first, read from pyproject.toml alone: this layer is rebuilt only when
# pyproject.toml changes, not on every source change.
COPY pyproject.toml ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

# Then the packages themselves (pyproject.toml names README.md as the long description).
COPY README.md ./
COPY runtime ./runtime
COPY realtime ./realtime
COPY server ./server
COPY threadline_wire ./threadline_wire
RUN pip install --no-deps .

# The browser client and the examples are read from /app: the server finds static/ next to
# its package directory, and THREADLINE_AGENT=examples.weather_agent:agent imports from here.
COPY static ./static
COPY examples ./examples

RUN useradd --system --uid 10001 --home-dir /app --shell /usr/sbin/nologin threadline \
    && mkdir -p /data \
    && chown threadline:threadline /data

# /app first on the path, so the server package next to static/ is the one imported.
# No development token: `serve` would otherwise mint one on every start and print it, with a
# browser URL carrying it, to the container log. Create tokens with `threadline token create`.
ENV PYTHONPATH=/app \
    THREADLINE_DEV_TOKEN=false \
    THREADLINE_HOST=0.0.0.0 \
    THREADLINE_PORT=8000 \
    THREADLINE_DATABASE_URL=sqlite:////data/threadline.sqlite3

USER threadline
VOLUME ["/data"]
EXPOSE 8000

HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=5 \
    CMD python -c "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('THREADLINE_PORT', '8000'), timeout=2)" || exit 1

CMD ["threadline", "serve", "--role", "all", "--host", "0.0.0.0", "--port", "8000"]
