#!/usr/bin/env bash
# Write a lock file a Droplet installs from: every package needed on linux x86_64 with Python
# PYTHON, exact versions and hashes.
#   scripts/lock-vllm.sh 0.33.0 3.12            ->  locks/vllm-0.33.0-py3.12.txt   (vllm phase)
#   scripts/lock-vllm.sh --router 0.1.17 3.12   ->  locks/router-0.1.17-py3.12.txt
#     (vllm-router, the front's cache-aware router; named apart so that no vllm-* glob takes it)
# Needs uv (pip install uv) and access to PyPI. Commit the file; a wheel install refuses to
# deploy a vLLM/Python pair without one.
set -euo pipefail

step() { printf '[lock-vllm] %s\n' "$*" >&2; }

package=vllm prefix=vllm
if [[ ${1:-} == --router ]]; then
  package=vllm-router prefix=router
  shift
fi
version=${1:?usage: scripts/lock-vllm.sh [--router] VERSION PYTHON_VERSION}
python=${2:?usage: scripts/lock-vllm.sh [--router] VERSION PYTHON_VERSION}
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="locks/${prefix}-${version}-py${python}.txt"
args=$([[ $package == vllm ]] && echo "${version} ${python}" || echo "--router ${version} ${python}")

step "check uv is installed"
command -v uv >/dev/null || { echo "uv is not on PATH: pip install uv" >&2; exit 1; }

step "resolve ${package}==${version} for Python ${python} on x86_64 manylinux"
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
echo "${package}==${version}" > "$tmp"
uv pip compile "$tmp" --quiet --generate-hashes --no-header \
  --python-version "$python" --python-platform x86_64-manylinux_2_28 --output-file "$out.new"
{
  echo "# Written by scripts/lock-vllm.sh ${args} (uv pip compile --generate-hashes"
  echo "# --python-version ${python} --python-platform x86_64-manylinux_2_28). Do not edit."
  cat "$out.new"
} > "$out"
rm -f "$out.new"

step "wrote ${out} ($(grep -c '^[A-Za-z0-9]' "$out") packages)"
grep -E "^(${package}|torch)==" "$out" | sed 's/ .*//' >&2
