# shellcheck shell=bash
# conda: Miniforge (conda-forge only) in NEMO_CONDA_PREFIX, checksum-verified, and two envs with
# the configured Python: the base of vLLM's envs (with uv, which installs vLLM; the vllm phase
# clones it into an env per release, beside the one the service runs from) and one for
# huggingface_hub (the model download runs there while uv installs vLLM).
# Settings: NEMO_CONDA_PREFIX NEMO_MINIFORGE_URL NEMO_MINIFORGE_SHA256 NEMO_PYTHON
#           NEMO_VLLM_BASE_ENV NEMO_HF_ENV

conda=$NEMO_CONDA_PREFIX/bin/conda

step miniforge "Miniforge in ${NEMO_CONDA_PREFIX}"
if [[ -x $conda ]]; then
  log "already installed: $("$conda" --version 2>&1), $(cache_note)"
else
  installer=/var/cache/nemotron/miniforge.sh
  download "$NEMO_MINIFORGE_URL" "$installer" "$NEMO_MINIFORGE_SHA256"
  # The prefix may be a mount point (the cache Volume's folder): empty it, never remove it, and
  # have the installer fill the folder that exists (-u; without it, it refuses one).
  mkdir -p "$NEMO_CONDA_PREFIX"
  find "$NEMO_CONDA_PREFIX" -mindepth 1 -delete
  bounded 900 bash "$installer" -b -u -p "$NEMO_CONDA_PREFIX" >&2 \
    || fail "the Miniforge installer failed" "read the lines above; pulumi up again retries from scratch"
  changed
fi

# ensure_env PREFIX PACKAGES...: an env with exactly the configured Python and these packages.
ensure_env() {
  local prefix=$1 have
  shift
  if [[ -x $prefix/bin/python ]]; then
    have=$("$prefix/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    if [[ $have == "$NEMO_PYTHON" ]]; then
      log "env ${prefix} has Python ${have}"
      return 0
    fi
    log "env ${prefix} has Python ${have}, not ${NEMO_PYTHON}: recreating it"
    rm -rf "$prefix"
  fi
  retry 3 bounded 1200 "$conda" create --yes --quiet --prefix "$prefix" \
      --override-channels --channel conda-forge "python=${NEMO_PYTHON}" "$@" >&2 \
    || fail "conda could not create ${prefix}" "check outbound network to conda-forge, then pulumi up again"
  changed
}

# Nothing runs from it: a new Python recreates it under a running service safely, and comes
# with a new lock (locks are per Python: catalog.lock_name), so with a new vLLM env.
step vllm-base-env "the env each vLLM env is cloned from: Python ${NEMO_PYTHON} and uv"
ensure_env "$NEMO_VLLM_BASE_ENV" uv

step hf-env "the env the model download runs in: huggingface_hub"
ensure_env "$NEMO_HF_ENV" huggingface_hub hf-xet

finish
