#!/usr/bin/env bash
# Write the lock file the vllm phase installs from: every package vLLM VERSION needs on
# linux x86_64 with Python PYTHON, exact versions and hashes.
#   scripts/lock-vllm.sh 0.33.0 3.12     ->  locks/vllm-0.33.0-py3.12.txt
# Needs uv (pip install uv) and access to PyPI. Commit the file; a wheel install refuses to
# deploy a vLLM/Python pair without one.
set -euo pipefail

step() { printf '[lock-vllm] %s\n' "$*" >&2; }

version=${1:?usage: scripts/lock-vllm.sh VLLM_VERSION PYTHON_VERSION}
python=${2:?usage: scripts/lock-vllm.sh VLLM_VERSION PYTHON_VERSION}
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="locks/vllm-${version}-py${python}.txt"

step "check uv is installed"
command -v uv >/dev/null || { echo "uv is not on PATH: pip install uv" >&2; exit 1; }

step "resolve vllm==${version} for Python ${python} on x86_64 manylinux"
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
echo "vllm==${version}" > "$tmp"
uv pip compile "$tmp" --quiet --generate-hashes --no-header \
  --python-version "$python" --python-platform x86_64-manylinux_2_28 --output-file "$out.new"
{
  echo "# Written by scripts/lock-vllm.sh ${version} ${python} (uv pip compile --generate-hashes"
  echo "# --python-version ${python} --python-platform x86_64-manylinux_2_28). Do not edit."
  cat "$out.new"
} > "$out"
rm -f "$out.new"

step "wrote ${out} ($(grep -c '^[A-Za-z0-9]' "$out") packages)"
grep -E '^(vllm|torch)==' "$out" | sed 's/ .*//' >&2
