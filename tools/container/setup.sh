#!/usr/bin/env bash
# The set-up of the course's Linux container (Dockerfile, .devcontainer/) and of CI (.ci/run), one script so that
# the container route is tried on every change: the Debian packages the course needs, then `make setup`.
#   make and git (the book test clones the repository), gcc (torch.compile's C++ on the CPU), and Chromium for the
#   widget test in a real browser (tests/test_browser.py; without it the browser tests skip, and in CI they fail).
set -euo pipefail
cd "$(dirname "$0")/../.."

packages=""
for tool in make:make git:git gcc:gcc chromium:chromium; do
  command -v "${tool%%:*}" >/dev/null 2>&1 || packages="$packages ${tool#*:}"
done
if [ -n "$packages" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    # shellcheck disable=SC2086
    apt-get install -y -q --no-install-recommends $packages libc6-dev ca-certificates >/dev/null
  else
    echo "setup: missing$packages (install them, or run as root on Debian/Ubuntu)" >&2
  fi
fi
make setup
