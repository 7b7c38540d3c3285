# shellcheck shell=bash
# vllm: install the pinned vLLM into an env of its own, NEMO_VLLM_ENV (named by the release and
# the lock: vllm_service.env_path), cloned from the conda phase's base env. `wheel`: every
# package from the committed lock file, hashes required, with uv. `source`: build at a git ref
# with the CUDA toolkit. Also what vLLM needs at run time from the system: a C compiler for
# Triton's launcher.
# The env the service runs from is never touched here: this phase runs on every replica at once,
# under running servers (their lazy imports and Triton's JIT read their env at any time). The
# service phase switches the unit to the new env, one drained replica at a time. The marker is
# written last, once `vllm --version` works: an env without it is incomplete and is redone.
# Envs neither the service's (its unit's, the one it was last started from) nor this one go.
# Settings: NEMO_VLLM_INSTALL NEMO_VLLM_VERSION NEMO_VLLM_ENV NEMO_VLLM_MARKER NEMO_CONDA_PREFIX
#           NEMO_VLLM_BASE_ENV NEMO_VLLM_ENV_PREFIX NEMO_UNIT NEMO_RUNS_ENV_FILE NEMO_LOCK_FILE
#           NEMO_LOCK_SHA256 NEMO_VLLM_GIT_URL NEMO_VLLM_GIT_REF NEMO_CUDA NEMO_CUDA_KEYRING_URL
#           NEMO_CUDA_KEYRING_SHA256 NEMO_RUNTIME_PACKAGES

env=$NEMO_VLLM_ENV
python=$env/bin/python
uv=$env/bin/uv
marker=$NEMO_VLLM_MARKER
# One uv cache for every env: a second env installs the wheels the first one downloaded.
export UV_CACHE_DIR=/var/cache/nemotron/uv UV_HTTP_TIMEOUT=120

# service_envs: the envs the service may be running from: the one its installed unit names
# (ExecStart, vllm_service.unit_text) and the one it was last started from (the service phase
# records it as it restarts; they differ while a switch is cut between the unit and the restart).
service_envs() {
  sed -n 's|^ExecStart=\(/[^ ]*\)/bin/vllm .*|\1|p' "/etc/systemd/system/${NEMO_UNIT}" 2>/dev/null || true
  cat "$NEMO_RUNS_ENV_FILE" 2>/dev/null || true
}
mapfile -t live < <(service_envs)
is_live() {
  local e
  for e in "${live[@]}"; do [[ $e == "$1" ]] && return 0; done
  return 1
}

step runtime-tools "what vLLM compiles with at first use: ${NEMO_RUNTIME_PACKAGES}"
read -ra runtime <<<"$NEMO_RUNTIME_PACKAGES"
missing=()
for package in "${runtime[@]}"; do
  [[ $(dpkg-query -W -f='${db:Status-Abbrev}' "$package" 2>/dev/null) == "ii "* ]] || missing+=("$package")
done
if (( ${#missing[@]} )); then
  apt_install "${missing[@]}" || fail "could not install ${missing[*]}" "check apt on the Droplet (apt-cache policy ${missing[*]})"
  changed
fi
command -v gcc >/dev/null \
  || fail "no C compiler after installing ${NEMO_RUNTIME_PACKAGES}; Triton needs one" "check /usr/bin/gcc on the Droplet"
log "C compiler: $(gcc --version 2>/dev/null | head -n 1)"

step lock "the lock file arrived intact"
got=$(sha256sum "$NEMO_LOCK_FILE" 2>/dev/null | cut -d' ' -f1 || true)
if [[ $got != "$NEMO_LOCK_SHA256" ]]; then
  fail "${NEMO_LOCK_FILE} is missing or changed (sha256 ${got:-none}, expected ${NEMO_LOCK_SHA256})" \
       "pulumi up again: the lock file is copied before this phase"
fi

if [[ $NEMO_VLLM_INSTALL == wheel ]]; then
  want="wheel ${NEMO_VLLM_VERSION} ${NEMO_LOCK_SHA256}"
else
  want="source ${NEMO_VLLM_GIT_REF} ${NEMO_LOCK_SHA256}"
fi

step old-envs "vLLM envs that are neither the service's nor this one"
for old in "${NEMO_VLLM_ENV_PREFIX:?}" "${NEMO_VLLM_ENV_PREFIX}"-*; do
  [[ -d $old && $old != "$env" ]] || continue
  if is_live "$old"; then
    log "keeping ${old}: the service runs from it until the service phase switches"
  else
    log "removing ${old}: neither the service's nor the one this config installs"
    rm -rf "$old"
    changed
  fi
done

step installed "is this exact vLLM already installed in ${env}?"
if [[ -f $marker && $(<"$marker") == "$want" ]] && "$env/bin/vllm" --version >/dev/null 2>&1; then
  log "already installed: ${want} matches the lock, $(cache_note); no install"
  finish "\"vllm\":\"$("$env/bin/vllm" --version 2>/dev/null | tail -n 1)\""
fi
if [[ -e $env ]]; then
  is_live "$env" \
    && fail "${env}, which the service runs from, is incomplete (no marker, or vllm does not start)" \
            "vLLM there cannot start: on the Droplet, systemctl stop ${NEMO_UNIT} && rm -rf ${env}; then pulumi up again reinstalls it and starts the service"
  log "${env} is incomplete (an install was cut or failed: no marker): redoing it"
  rm -rf "$env"
fi

step env "a new env ${env}, cloned from ${NEMO_VLLM_BASE_ENV} (Python and uv)"
[[ -x $NEMO_VLLM_BASE_ENV/bin/uv ]] \
  || fail "no base env ${NEMO_VLLM_BASE_ENV} with uv" "the conda phase makes it: pulumi up again"
# --clone: "Path to (or name of) existing local environment" (docs.conda.io, conda create);
# conda links the base's packages from its package cache (downloading only what is missing
# there), so the new env has the same Python and uv as the base.
bounded 1200 "$NEMO_CONDA_PREFIX/bin/conda" create --yes --quiet --prefix "$env" \
    --clone "$NEMO_VLLM_BASE_ENV" >&2 \
  || fail "conda could not clone ${NEMO_VLLM_BASE_ENV} into ${env}" "read the lines above, then pulumi up again (it starts the env over)"
changed

if [[ $NEMO_VLLM_INSTALL == wheel ]]; then
  step install "uv installs vLLM ${NEMO_VLLM_VERSION} and its dependencies from the lock"
  retry 3 bounded 3600 "$uv" pip install --python "$python" --require-hashes --no-deps \
      --requirement "$NEMO_LOCK_FILE" >&2 \
    || fail "uv could not install the locked packages" \
            "check outbound network to PyPI; if a version was yanked, regenerate the lock with scripts/lock-vllm.sh"
else
  step toolkit "the CUDA ${NEMO_CUDA} toolkit (nvcc) for the build"
  nvcc=/usr/local/cuda/bin/nvcc
  if [[ -x $nvcc ]] && "$nvcc" --version | grep -q "release ${NEMO_CUDA}"; then
    log "nvcc for CUDA ${NEMO_CUDA} is installed"
  else
    download "$NEMO_CUDA_KEYRING_URL" /var/cache/nemotron/cuda-keyring.deb "$NEMO_CUDA_KEYRING_SHA256"
    flock --wait "$APT_LOCK_WAIT_SECONDS" "$STATE_DIR/apt.lock" dpkg -i /var/cache/nemotron/cuda-keyring.deb >&2
    APT_SECONDS=3600 apt_install "cuda-toolkit-${NEMO_CUDA//./-}" \
      || fail "could not install cuda-toolkit-${NEMO_CUDA//./-}" "check NVIDIA's apt repository for this Ubuntu release"
  fi

  step source "vLLM source at ${NEMO_VLLM_GIT_REF}"
  src=/opt/vllm-src
  if [[ ! -d $src/.git ]]; then
    retry 3 bounded 900 git clone --quiet "$NEMO_VLLM_GIT_URL" "$src" >&2 || fail "git clone ${NEMO_VLLM_GIT_URL} failed" "check outbound network"
  fi
  retry 3 bounded 900 git -C "$src" fetch --quiet --tags origin >&2 || fail "git fetch failed" "check outbound network"
  git -C "$src" checkout --quiet --force "$NEMO_VLLM_GIT_REF" >&2 \
    || fail "no git ref ${NEMO_VLLM_GIT_REF} in ${NEMO_VLLM_GIT_URL}" "set vllm.gitRef to a tag, branch or commit that exists"

  step build-deps "the locked dependencies (torch and friends), without vLLM itself"
  grep -v '^vllm==' "$NEMO_LOCK_FILE" > /var/cache/nemotron/lock-without-vllm.txt
  retry 3 bounded 3600 "$uv" pip install --python "$python" --require-hashes --no-deps \
      --requirement /var/cache/nemotron/lock-without-vllm.txt >&2 || fail "uv could not install the build dependencies" "check outbound network to PyPI"

  step build "compile vLLM (MAX_JOBS from cores and memory)"
  cores=$(nproc)
  mem_gb=$(awk '/MemTotal/ {print int($2 / 1048576)}' /proc/meminfo)
  # About 8 GB of RAM per nvcc job keeps the build out of the OOM killer.
  jobs=$(( mem_gb / 8 < cores ? mem_gb / 8 : cores ))
  (( jobs >= 1 )) || jobs=1
  log "MAX_JOBS=${jobs} (${cores} cores, ${mem_gb} GB)"
  (cd "$src" && MAX_JOBS=$jobs CUDA_HOME=/usr/local/cuda bounded 14400 "$uv" pip install --python "$python" --no-build-isolation --no-deps . >&2) \
    || fail "the vLLM build failed" "read the compiler errors above; a smaller MAX_JOBS helps when the build was killed"
fi

step verify "vllm --version, then the marker that says ${env} is complete"
version=$("$env/bin/vllm" --version 2>/dev/null | tail -n 1) \
  || fail "vllm was installed but does not start" "read the lines above"
printf '%s\n' "$want" > "$marker.part"
mv "$marker.part" "$marker"
log "installed in ${env}; the service phase switches the service to it"
finish "\"vllm\":\"${version}\""
