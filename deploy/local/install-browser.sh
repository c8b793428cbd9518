#!/usr/bin/env bash
# Debian's Chromium for the UI test (tests/test_ui_browser.py), installed when it is missing.
# `make test` runs this first, so the README's test command needs no other set-up step.
# Playwright drives this binary; `playwright install` is never run (it downloads a browser).
set -euo pipefail
CHROMIUM=/usr/bin/chromium

if [ -x "$CHROMIUM" ]; then
  exit 0
fi
source "$(dirname "$0")/apt-install.sh"
apt_install chromium "Chromium at $CHROMIUM (the UI test drives it headless)"
if [ ! -x "$CHROMIUM" ]; then
  echo "make test: apt-get installed chromium but $CHROMIUM is still missing" >&2
  exit 1
fi
echo "make test: $("$CHROMIUM" --version 2>/dev/null || echo chromium) installed"
