# shellcheck shell=bash
# vllm: install the pinned vLLM into the vLLM env. `wheel`: every package from the committed
# lock file, hashes required, with uv. `source`: build at a git ref with the CUDA toolkit.
# Also what vLLM needs at run time from the system: a C compiler for Triton's launcher.
# Settings: NEMO_VLLM_INSTALL NEMO_VLLM_VERSION NEMO_VLLM_ENV NEMO_VLLM_MARKER NEMO_LOCK_FILE
#           NEMO_LOCK_SHA256 NEMO_VLLM_GIT_URL NEMO_VLLM_GIT_REF NEMO_CUDA NEMO_CUDA_KEYRING_URL
#           NEMO_RUNTIME_PACKAGES

python=$NEMO_VLLM_ENV/bin/python
uv=$NEMO_VLLM_ENV/bin/uv
marker=$NEMO_VLLM_MARKER
export UV_CACHE_DIR=/var/cache/nemotron/uv UV_HTTP_TIMEOUT=120

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

step installed "is this exact vLLM already installed?"
if [[ -f $marker && $(<"$marker") == "$want" ]] && "$NEMO_VLLM_ENV/bin/vllm" --version >/dev/null 2>&1; then
  log "already installed: ${want} matches the lock, $(cache_note); no install"
  finish "\"vllm\":\"$("$NEMO_VLLM_ENV/bin/vllm" --version 2>/dev/null | tail -n 1)\""
fi
rm -f "$marker"

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

step verify "vllm --version"
version=$("$NEMO_VLLM_ENV/bin/vllm" --version 2>/dev/null | tail -n 1) \
  || fail "vllm was installed but does not start" "read the lines above"
printf '%s\n' "$want" > "$marker"
changed
finish "\"vllm\":\"${version}\""
