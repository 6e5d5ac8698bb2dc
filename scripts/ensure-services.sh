#!/usr/bin/env bash
# Install what the test suite needs when it is missing, from the distribution's packages:
# PostgreSQL server programs, redis-server, Chromium, node, Prometheus. Nothing is started here:
# the suite runs its own throwaway PostgreSQL cluster, redis-server (tests/servers.py) and
# Prometheus (tests/e2e/prometheus_server.py; THREADLINE_TEST_PROMETHEUS names another binary).
# THREADLINE_TEST_POSTGRES_DSN / THREADLINE_TEST_REDIS_URL / THREADLINE_TEST_CHROMIUM point the
# suite at what you already have instead; then nothing is installed for it.
set -euo pipefail

say() { echo "make test: $*"; }

has_postgres() {
  { command -v initdb && command -v postgres; } >/dev/null 2>&1 && return 0
  compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null
}

missing=()      # what is missing, for the message
packages=()     # the Debian packages that provide it
if [[ -z ${THREADLINE_TEST_POSTGRES_DSN:-} ]] && ! has_postgres; then
  missing+=("PostgreSQL (initdb, postgres)"); packages+=(postgresql)
fi
if [[ -z ${THREADLINE_TEST_REDIS_URL:-} ]] && ! command -v redis-server >/dev/null 2>&1; then
  missing+=("redis-server"); packages+=(redis-server)
fi
if [[ -z ${THREADLINE_TEST_CHROMIUM:-} && ! -x /usr/bin/chromium ]]; then
  missing+=("Chromium (/usr/bin/chromium)"); packages+=(chromium)
fi
if ! command -v callgrind_control >/dev/null 2>&1; then
  missing+=("valgrind (bench/instructions.py's smoke test)"); packages+=(valgrind)
fi
if [[ -z ${THREADLINE_TEST_PROMETHEUS:-} ]] && ! command -v prometheus >/dev/null 2>&1; then
  missing+=("Prometheus (tests/e2e/test_metrics.py scrapes real servers)"); packages+=(prometheus)
fi
if ! command -v node >/dev/null 2>&1; then
  missing+=("node (for tests/unit/js and tests/js)"); packages+=(nodejs)
fi
if ! command -v npm >/dev/null 2>&1; then
  missing+=("npm (installs tests/js: the AG-UI and AI SDK client libraries)"); packages+=(npm)
fi

install_missing() {
  local list
  list=$(IFS=,; echo "${missing[*]}" | sed 's/,/, /g')
  say "missing: $list"
  command -v apt-get >/dev/null 2>&1 || { cannot_install "no apt-get on this system"; return; }
  local as_root=()
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null 2>&1 || { cannot_install "not root and no sudo"; return; }
    as_root=(sudo)
    say "using sudo to install packages"
  fi
  say "installing ${packages[*]} with apt-get"
  # Wait for a concurrent apt/dpkg (an unattended upgrade, another make test) instead of failing.
  local apt=("${as_root[@]}" env DEBIAN_FRONTEND=noninteractive NEEDRESTART_SUSPEND=1
             apt-get -o DPkg::Lock::Timeout=300)
  "${apt[@]}" update -qq
  "${apt[@]}" install -y -qq "${packages[@]}" >/dev/null
  say "installed ${packages[*]}"
}

cannot_install() {
  say "$1. Install them yourself (Debian packages: ${packages[*]}),"
  say "or point the suite at existing ones with THREADLINE_TEST_POSTGRES_DSN,"
  say "THREADLINE_TEST_REDIS_URL, THREADLINE_TEST_CHROMIUM (README.md, Set up)."
  say "Tests needing them are skipped; under CI=true they fail."
  [[ ${CI:-} == true ]] && exit 1
  exit 0
}

if [[ ${#packages[@]} -eq 0 ]]; then
  say "PostgreSQL, Redis, Chromium, Prometheus, node and npm are present"
else
  install_missing
fi

# The AG-UI and AI SDK client libraries (tests/js) need Node 20 or newer; some distributions
# (Debian bookworm) ship 18. Then take Node 20 from the npm registry's per-platform package into
# .tools/ (make test puts .tools/node/bin first on PATH); nothing system-wide changes.
node_major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
if [[ $node_major -lt 20 && ! -x .tools/node/bin/node ]]; then
  case $(uname -m) in
    x86_64) platform=linux-x64 ;;
    aarch64) platform=linux-arm64 ;;
    *) say "node $node_major is older than 20 and no Node 20 package fits $(uname -m)"; exit 0 ;;
  esac
  say "node $node_major is older than 20: installing node-$platform@20 from the npm registry into .tools/"
  npm install --silent --no-audit --no-fund --prefix .tools/node20 "node-$platform@20.20.2"
  mkdir -p .tools/node/bin
  ln -sf "$PWD/.tools/node20/node_modules/node-$platform/bin/node" .tools/node/bin/node
fi
