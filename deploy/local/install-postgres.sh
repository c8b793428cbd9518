#!/usr/bin/env bash
# Debian's PostgreSQL server binaries for the tests that run the output tables' SQL catalog on a
# real PostgreSQL (tests/conftest.py starts its own server with initdb and pg_ctl in a temporary
# folder, on loopback; no service is enabled). `make test` runs this first, beside the browser.
set -euo pipefail

found() {
  command -v pg_ctl >/dev/null 2>&1 || compgen -G "/usr/lib/postgresql/*/bin/pg_ctl" >/dev/null
}

if found; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "make test: PostgreSQL's server (pg_ctl, initdb) is missing and this machine has no" \
       "apt-get; install PostgreSQL's server binaries and run make test again" >&2
  exit 1
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "make test: PostgreSQL's server (pg_ctl, initdb) is missing; install it as root:" \
       "sudo apt-get update && sudo apt-get install -y postgresql, then run make test again" >&2
  exit 1
fi
echo "make test: installing Debian's postgresql for the catalog tests ..."
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq postgresql >/dev/null
if ! found; then
  echo "make test: apt-get installed postgresql but pg_ctl is still missing" >&2
  exit 1
fi
echo "make test: PostgreSQL $(ls /usr/lib/postgresql | tail -1) installed"
