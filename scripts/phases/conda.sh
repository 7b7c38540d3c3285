# shellcheck shell=bash
# conda: Miniforge (conda-forge only) in NEMO_CONDA_PREFIX, checksum-verified, and two envs with
# the configured Python: the base of vLLM's envs (with uv, which installs vLLM; the vllm phase
# clones it into an env per release, beside the one the service runs from) and one for
# huggingface_hub at the vLLM lock's version (the model download runs there while uv installs
# vLLM).
# Settings: NEMO_CONDA_PREFIX NEMO_MINIFORGE_URL NEMO_MINIFORGE_SHA256 NEMO_PYTHON
#           NEMO_VLLM_BASE_ENV NEMO_HF_ENV NEMO_HF_PACKAGES (conda specs, NAME==VERSION: the lock's)

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

# missing_pin PREFIX SPECS...: the first NAME==VERSION of SPECS the env does not hold, read
# from conda's own record of what it installed (conda-meta/NAME-VERSION-BUILD.json); nothing
# when it holds them all, or when it was made without them because conda-forge had none
# (UNPINNED records which pins were asked for then: a new lock asks again).
UNPINNED=.nemotron-unpinned
missing_pin() {
  local prefix=$1 spec
  shift
  if [[ -f $prefix/$UNPINNED && $(<"$prefix/$UNPINNED") == "$*" ]]; then
    return 0
  fi
  for spec in "$@"; do
    [[ $spec == *==* ]] || continue
    if ! compgen -G "${prefix}/conda-meta/${spec%%==*}-${spec#*==}-*.json" >/dev/null; then
      printf '%s\n' "$spec"
      return 0
    fi
  done
}

# conda_create PREFIX SPECS...: conda create from conda-forge with the configured Python; its
# messages go to the log, and the last try's stay in CREATE_ERRORS for the caller to read.
CREATE_ERRORS=$STATE_DIR/conda-create.err
conda_create() {
  local prefix=$1 status=0
  shift
  mkdir -p "$STATE_DIR"
  bounded 1200 "$conda" create --yes --quiet --prefix "$prefix" --override-channels \
      --channel conda-forge "python=${NEMO_PYTHON}" "$@" >&2 2>"$CREATE_ERRORS" || status=$?
  cat "$CREATE_ERRORS" >&2
  return "$status"
}

# ensure_env PREFIX PACKAGES...: an env with exactly the configured Python and these packages
# (at the versions a NAME==VERSION spec pins).
ensure_env() {
  local prefix=$1 have missing
  shift
  if [[ -x $prefix/bin/python ]]; then
    have=$("$prefix/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    missing=$(missing_pin "$prefix" "$@")
    if [[ $have == "$NEMO_PYTHON" && -z $missing ]]; then
      log "env ${prefix} has Python ${have}${*:+ and $*}"
      return 0
    fi
    if [[ $have != "$NEMO_PYTHON" ]]; then
      log "env ${prefix} has Python ${have}, not ${NEMO_PYTHON}: recreating it"
    else
      log "env ${prefix} has no ${missing}: recreating it"
    fi
    rm -rf "$prefix"
  fi
  if ! conda_create "$prefix" "$@"; then
    if [[ "$*" == *==* ]] && grep -q PackagesNotFoundError "$CREATE_ERRORS"; then
      # conda-forge may not carry a PyPI release yet, and no retry changes that: an env with
      # its newest beats no download. Only this refusal: a network failure keeps the pins.
      log "conda-forge has no ${*}: trying its newest of each instead (the download's behaviour is tested with the pinned ones)"
      rm -rf "$prefix"
      retry 3 conda_create "$prefix" "${@%%==*}" \
        || fail "conda could not create ${prefix}" "check outbound network to conda-forge, then pulumi up again"
      printf '%s\n' "$*" > "$prefix/$UNPINNED"
    else
      retry 2 conda_create "$prefix" "$@" \
        || fail "conda could not create ${prefix}" "check outbound network to conda-forge, then pulumi up again"
    fi
  fi
  rm -f "$CREATE_ERRORS"
  changed
}

# Nothing runs from it: a new Python recreates it under a running service safely, and comes
# with a new lock (locks are per Python: catalog.lock_name), so with a new vLLM env.
step vllm-base-env "the env each vLLM env is cloned from: Python ${NEMO_PYTHON} and uv"
ensure_env "$NEMO_VLLM_BASE_ENV" uv

step hf-env "the env the model download runs in: ${NEMO_HF_PACKAGES[*]}"
ensure_env "$NEMO_HF_ENV" "${NEMO_HF_PACKAGES[@]}"

finish
