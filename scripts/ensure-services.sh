#!/usr/bin/env bash
# Install what the test suite needs when it is missing, from the distribution's packages:
# PostgreSQL server programs, redis-server, Chromium, node. Nothing is started here: the suite
# runs its own throwaway PostgreSQL cluster and redis-server (tests/servers.py).
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
if ! command -v node >/dev/null 2>&1; then
  missing+=("node (for tests/unit/js)"); packages+=(nodejs)
fi

if [[ ${#packages[@]} -eq 0 ]]; then
  say "PostgreSQL, Redis, Chromium and node are present"
  exit 0
fi

list=$(IFS=,; echo "${missing[*]}" | sed 's/,/, /g')
say "missing: $list"

if ! command -v apt-get >/dev/null 2>&1; then
  say "no apt-get on this system: install them yourself, or point the suite at existing servers"
  say "with THREADLINE_TEST_POSTGRES_DSN, THREADLINE_TEST_REDIS_URL, THREADLINE_TEST_CHROMIUM"
  say "(see README.md, Set up). Tests that need them are skipped (they fail under CI=true)."
  [[ ${CI:-} == true ]] && exit 1
  exit 0
fi

if [[ $(id -u) -eq 0 ]]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1; then
  as_root=(sudo)
  say "using sudo to install packages"
else
  say "not root and no sudo: run as root: apt-get install ${packages[*]}"
  exit 1
fi

say "installing ${packages[*]} with apt-get"
# Wait for a concurrent apt/dpkg (an unattended upgrade, another make test) instead of failing.
apt=("${as_root[@]}" env DEBIAN_FRONTEND=noninteractive NEEDRESTART_SUSPEND=1 apt-get -o DPkg::Lock::Timeout=300)
"${apt[@]}" update -qq
"${apt[@]}" install -y -qq "${packages[@]}" >/dev/null
say "installed ${packages[*]}"
