#!/usr/bin/env bash
# Debian's Prometheus server and Pushgateway for the metrics tests
# (tests/test_prometheus_metrics.py): the tests start their own on free loopback ports, with a
# configuration and storage in a temporary folder; no service is enabled. `make test` runs this
# first, beside Redis and PostgreSQL.
set -euo pipefail

found() {
  command -v prometheus >/dev/null 2>&1 && command -v prometheus-pushgateway >/dev/null 2>&1
}

if found; then
  exit 0
fi
source "$(dirname "$0")/apt-install.sh"
command -v prometheus >/dev/null 2>&1 || apt_install prometheus "Prometheus's server (prometheus)"
command -v prometheus-pushgateway >/dev/null 2>&1 ||
  apt_install prometheus-pushgateway "Prometheus's Pushgateway (prometheus-pushgateway)"
if ! found; then
  echo "make test: apt-get installed prometheus and prometheus-pushgateway but one is still missing" >&2
  exit 1
fi
echo "make test: $(prometheus --version 2>&1 | head -1 | cut -d' ' -f1-3) installed"
