#!/usr/bin/env bash
# Make the docker-compose deployment startable on this machine, for tests/deploy only:
#   1. Debian's docker.io, docker-compose (1.29) and debootstrap, installed with apt when missing;
#   2. a running Docker engine (dockerd started in the background when none answers);
#   3. the four public base images the Dockerfile and docker-compose.yml name. Each one is pulled
#      if a registry answers; only when it cannot be pulled is a stand-in built from Debian
#      packages (tests/deploy/standins/*.Dockerfile on a debootstrapped bookworm root) and
#      tagged with the public name. Stand-ins carry a label with the hash of their inputs and are
#      rebuilt only when those change, so repeated runs cost a few `docker image inspect`s.
# Exits 0 when all of this holds. Needs root for the first two steps when they have work to do.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
STANDINS="$HERE/standins"
LOG_DIR=${THREADLINE_DOCKER_LOG_DIR:-/var/log}
PULL_TIMEOUT=${THREADLINE_DOCKER_PULL_TIMEOUT:-20}
BASE=threadline-standin/base:bookworm
LABEL=threadline.standin.hash
# public image -> stand-in Dockerfile (and entrypoint script, if any) in $STANDINS
declare -A STANDIN=(
    [python:3.11-slim]=python
    [postgres:16]=postgres
    [redis:7]=redis
    [nginx:1.27]=nginx
)

say() { echo "ensure-docker: $*" >&2; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else say "needs root: $*"; exit 3; fi; }

# --- 1. packages ------------------------------------------------------------------------------
missing=()
command -v docker >/dev/null || missing+=(docker.io)
command -v dockerd >/dev/null || missing+=(docker.io)
command -v docker-compose >/dev/null || missing+=(docker-compose)
command -v debootstrap >/dev/null || missing+=(debootstrap)
# The Python stand-in gets this machine's CA bundle (pip inside image builds needs it).
[ -f /etc/ssl/certs/ca-certificates.crt ] || missing+=(ca-certificates)
if ((${#missing[@]})); then
    say "installing ${missing[*]}"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        $(printf '%s\n' "${missing[@]}" | sort -u) >/dev/null
fi

# --- 2. engine --------------------------------------------------------------------------------
if ! docker info >/dev/null 2>&1; then
    say "starting dockerd (log: $LOG_DIR/dockerd.log)"
    as_root true
    mkdir -p "$LOG_DIR"
    # Its own session, so it outlives the test run that started it (and its process group).
    setsid dockerd >>"$LOG_DIR/dockerd.log" 2>&1 </dev/null &
    for _ in $(seq 120); do
        docker info >/dev/null 2>&1 && break
        sleep 0.5
    done
    docker info >/dev/null 2>&1 || { tail -20 "$LOG_DIR/dockerd.log" >&2; say "dockerd did not start"; exit 4; }
fi

# --- 3. base images ---------------------------------------------------------------------------
# The bookworm mirror of this machine's apt sources (one-line and deb822 formats), because the
# stand-ins must be built from wherever this machine gets its Debian packages.
debian_mirror() {
    python3 - /etc/apt/sources.list /etc/apt/sources.list.d/* <<'PY'
import pathlib, sys
for name in sys.argv[1:]:
    path = pathlib.Path(name)
    if not path.is_file():
        continue
    text = path.read_text(errors="replace")
    if name.endswith(".sources"):
        for stanza in text.split("\n\n"):
            fields = {}
            for line in stanza.splitlines():
                if ":" in line and not line.lstrip().startswith("#"):
                    key, _, value = line.partition(":")
                    fields[key.strip().lower()] = value.split()
            if "deb" in fields.get("types", []) and "bookworm" in fields.get("suites", []):
                print(fields["uris"][0]); sys.exit(0)
    else:
        for line in text.splitlines():
            words = [w for w in line.split("#", 1)[0].split() if not w.startswith("[")]
            if len(words) >= 3 and words[0] == "deb" and words[2] == "bookworm":
                print(words[1]); sys.exit(0)
sys.exit("no bookworm source in this machine's apt sources: debootstrap needs its mirror")
PY
}

# pip's index settings of this machine (environment first, then pip's own configuration), for
# pip inside image builds; file:// indexes of the host are useless inside a container.
pip_conf() {
    local index extra
    index=${PIP_INDEX_URL:-$(python3 -m pip config get global.index-url 2>/dev/null || true)}
    extra=${PIP_EXTRA_INDEX_URL:-$(python3 -m pip config get global.extra-index-url 2>/dev/null || true)}
    echo "[global]"
    echo "cert = /etc/ssl/certs/ca-certificates.crt"
    case "$index" in http*) echo "index-url = $index" ;; esac
    extra=$(tr ' ' '\n' <<<"$extra" | grep '^http' | tr '\n' ' ' || true)
    [ -n "${extra// /}" ] && echo "extra-index-url = $extra"
    return 0
}

ensure_base() {
    docker image inspect "$BASE" >/dev/null 2>&1 && return 0
    local root mirror
    mirror=$(debian_mirror)
    root=$(mktemp -d /var/tmp/threadline-bookworm.XXXXXX)
    say "debootstrap --variant=minbase bookworm from $mirror (a few minutes, once)"
    as_root debootstrap --variant=minbase bookworm "$root" "$mirror" >"$LOG_DIR/debootstrap.log" 2>&1 \
        || { tail -20 "$LOG_DIR/debootstrap.log" >&2; rm -rf "$root"; exit 5; }
    # Smaller image, and apt inside builds never keeps package files.
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    echo 'APT::Install-Recommends "false"; APT::Install-Suggests "false";' \
        >"$root/etc/apt/apt.conf.d/90threadline-standin"
    tar -C "$root" -c . | docker import -c 'CMD ["/bin/bash"]' - "$BASE" >/dev/null
    rm -rf "$root"
}

# The stand-in hash label of a local image ("" for real images and missing ones).
label_of() {
    local value
    value=$(docker image inspect -f "{{ index .Config.Labels \"$LABEL\" }}" "$1" 2>/dev/null || true)
    [ "$value" = "<no value>" ] && value=""
    echo "$value"
}

build_standin() {
    local image=$1 name=${STANDIN[$1]} context hash
    context=$(mktemp -d)
    cp "$STANDINS/$name.Dockerfile" "$context/Dockerfile"
    cp "$STANDINS/$name"-*.sh "$context/" 2>/dev/null || true
    cp /etc/ssl/certs/ca-certificates.crt "$context/"
    printf '%s\n' "$PIP_CONF" >"$context/pip.conf"
    hash=$(cd "$context" && shopt -s nullglob \
        && cat Dockerfile ./*.sh ca-certificates.crt pip.conf | sha256sum | cut -c1-16)
    if [ "$(label_of "$image")" = "$hash" ]; then rm -rf "$context"; return 0; fi
    ensure_base
    say "building stand-in $image from standins/$name.Dockerfile"
    docker build -q --label "$LABEL=$hash" -t "$image" "$context" >/dev/null \
        || { rm -rf "$context"; say "stand-in $image failed to build"; exit 6; }
    rm -rf "$context"
}

PIP_CONF=$(pip_conf)
for image in "${!STANDIN[@]}"; do
    # A stand-in built earlier carries the label: check it is current (never pull over it).
    if [ -n "$(label_of "$image")" ]; then
        build_standin "$image"
    elif docker image inspect "$image" >/dev/null 2>&1; then
        continue  # the real image is here
    elif timeout "$PULL_TIMEOUT" docker pull -q "$image" >/dev/null 2>&1; then
        say "pulled $image"
    else
        build_standin "$image"
    fi
done
