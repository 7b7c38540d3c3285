#!/usr/bin/env bash
# The Debian/Ubuntu packages the tests use for real: a real sshd (the bootstrap over SSH), a real
# ACME CA (pebble), network namespaces (iproute2), firewall rules (nftables) and the waker's
# aiohttp (python3-aiohttp). Installs the
# missing ones with apt-get: as root directly (this machine's CI), else through `sudo -n` when sudo
# needs no password (a GitHub-hosted runner: user `runner`, passwordless sudo, no pebble in the
# image); otherwise it names them and fails. ./check runs it; a CI step may run it alone.
set -euo pipefail

missing=()
# One line a package: how to tell it is there, then what to install. The emulated front runs
# the waker on the system Python with the distribution's aiohttp, as a Droplet does
# (components/host/wake.py PYTHON, APT_PACKAGE).
[ -x /usr/sbin/sshd ] || missing+=(openssh-server openssh-client)
command -v pebble >/dev/null || missing+=(pebble)
command -v ip >/dev/null || missing+=(iproute2)
command -v nft >/dev/null || missing+=(nftables)
/usr/bin/python3 -c 'import aiohttp' 2>/dev/null || missing+=(python3-aiohttp)
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
