#!/usr/bin/env bash
# Debian's Chromium and ChromeDriver for the dashboard's browser test (never a downloaded browser
# build: no such download works here). Idempotent; needs root or sudo.
set -euo pipefail
SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
  echo "[browser] chromium $(chromium --version 2>/dev/null | awk '{print $2}') already installed"
  exit 0
fi
echo "[browser] installing chromium + chromium-driver via apt"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
