#!/usr/bin/env bash
# The Debian/Ubuntu packages the tests use for real: a real sshd (the bootstrap over SSH), a real
# ACME CA (pebble), network namespaces (iproute2) and firewall rules (nftables). Installs the
# missing ones with apt-get: as root directly (this machine's CI), else through `sudo -n` when sudo
# needs no password (a GitHub-hosted runner: user `runner`, passwordless sudo, no pebble in the
# image); otherwise it names them and fails. ./check runs it; a CI step may run it alone.
set -euo pipefail

missing=()
# One line a package: how to tell it is there, then what to install. (python3-aiohttp, when the
# tests need the system Python's aiohttp: /usr/bin/python3 -c 'import aiohttp' || missing+=(...))
[ -x /usr/sbin/sshd ] || missing+=(openssh-server openssh-client)
command -v pebble >/dev/null || missing+=(pebble)
command -v ip >/dev/null || missing+=(iproute2)
command -v nft >/dev/null || missing+=(nftables)
[ ${#missing[@]} -gt 0 ] || exit 0

as_root=()
if [ "$(id -u)" != 0 ]; then
  # -n: never prompt (no terminal in CI); a sudo that wants a password fails here, at once.
  if command -v apt-get >/dev/null && command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
  else
    echo "[check] missing ${missing[*]}: install them (the tests use the real programs)" >&2
    echo "[check] (not root, and no sudo without a password to install them with apt-get)" >&2
    exit 1
  fi
elif ! command -v apt-get >/dev/null; then
  echo "[check] missing ${missing[*]}: install them (the tests use the real programs)" >&2
  exit 1
fi
echo "[check] installing ${missing[*]}${as_root[*]:+ (with ${as_root[*]})}"
"${as_root[@]}" apt-get update -qq
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
  "${missing[@]}" >/dev/null
