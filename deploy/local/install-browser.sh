#!/usr/bin/env bash
# Debian's Chromium for the UI test (tests/test_ui_browser.py), installed when it is missing.
# `make test` runs this first, so the README's test command needs no other set-up step.
# Playwright drives this binary; `playwright install` is never run (it downloads a browser).
set -euo pipefail
CHROMIUM=/usr/bin/chromium

if [ -x "$CHROMIUM" ]; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "make test: Chromium is missing at $CHROMIUM and this machine has no apt-get;" \
       "install a Chromium at $CHROMIUM (the UI test drives it headless) and run make test again" >&2
  exit 1
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "make test: Chromium is missing at $CHROMIUM; install it as root:" \
       "sudo apt-get update && sudo apt-get install -y chromium, then run make test again" >&2
  exit 1
fi
echo "make test: installing Debian's chromium for the UI test (about 30 s) ..."
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq chromium >/dev/null
if [ ! -x "$CHROMIUM" ]; then
  echo "make test: apt-get installed chromium but $CHROMIUM is still missing" >&2
  exit 1
fi
echo "make test: $("$CHROMIUM" --version 2>/dev/null || echo chromium) installed"
