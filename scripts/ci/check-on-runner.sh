#!/usr/bin/env bash
# ./check on a GitHub-hosted runner (ubuntu-24.04): the job runs as the user `runner`, with
# passwordless sudo. The suite's sandbox, SSH and network tests need root (mount and network
# namespaces, loop devices, an sshd that logs in as root, nft rules): run as `runner` they skip
# themselves, and a green run would prove less than this machine's CI, which is root. So
# ./check runs whole under sudo, as here: it installs the missing packages with apt-get (pebble:
# the image has none), builds its venvs and runs every test.
# sudo resets PATH to its secure_path and drops LD_LIBRARY_PATH, and actions/setup-python puts its
# Python (in the tool cache, owned by runner) on PATH and its lib/ in LD_LIBRARY_PATH: env hands
# both to ./check. HOME becomes root's (sudo's env_reset), so no root-owned cache lands in
# runner's home. The runner's VM is discarded after the job: the root-owned venvs do no harm.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

if [ "$(id -u)" = 0 ]; then
  exec ./check "$@"
fi
if ! sudo -n true 2>/dev/null; then
  echo "[check-on-runner] the tests need root: run as root, or as a user whose sudo needs no password" >&2
  exit 1
fi
exec sudo -n env "PATH=$PATH" "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}" ./check "$@"
