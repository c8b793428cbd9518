#!/usr/bin/env bash
# Debian's PostgreSQL server binaries for the tests that need a real PostgreSQL (the output
# tables' SQL catalog, the ECS tests' instance storage): the tests start their own server with
# initdb in a temporary folder, on loopback; no service is enabled. `make test` runs this first,
# beside the browser.
set -euo pipefail

found() {
  command -v pg_ctl >/dev/null 2>&1 || compgen -G "/usr/lib/postgresql/*/bin/pg_ctl" >/dev/null
}

if found; then
  exit 0
fi
source "$(dirname "$0")/apt-install.sh"
apt_install postgresql "PostgreSQL's server (initdb, pg_ctl)"
if ! found; then
  echo "make test: apt-get installed postgresql but pg_ctl is still missing" >&2
  exit 1
fi
echo "make test: PostgreSQL $(ls /usr/lib/postgresql | tail -1) installed"
