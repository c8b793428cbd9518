#!/usr/bin/env bash
# Debian's Redis server binary for the serving tests on Redis (tests/test_serving.py): the tests
# start their own redis-server in a temporary folder, on a free loopback port, without
# persistence; no service is enabled. `make test` runs this first, beside PostgreSQL.
set -euo pipefail

found() {
  command -v redis-server >/dev/null 2>&1
}

if found; then
  exit 0
fi
source "$(dirname "$0")/apt-install.sh"
apt_install redis-server "Redis's server (redis-server)"
if ! found; then
  echo "make test: apt-get installed redis-server but redis-server is still missing" >&2
  exit 1
fi
echo "make test: $(redis-server --version | cut -d' ' -f1-3) installed"
