#!/usr/bin/env bash
# Installs headless Chromium (Debian package chromium) for the report's browser test
# where apt and root are available; elsewhere that test is skipped with its reason.
set -uo pipefail
if command -v chromium >/dev/null || command -v chromium-browser >/dev/null; then
  exit 0
fi
if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1 \
    || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }; } \
    && exit 0
  echo "apt-get could not install chromium; the browser test of the report will be skipped." >&2
else
  echo "No apt-get as root here; the browser test of the report will be skipped." >&2
fi
exit 0
