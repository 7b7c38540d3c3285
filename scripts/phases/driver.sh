# shellcheck shell=bash
# driver: make sure the NVIDIA driver can run the CUDA of the pinned vLLM wheels. The check is
# always the same; what happens when it fails depends on NEMO_DRIVER_MODE. Installs only when
# the check fails, and asks for a reboot only when it installed.
# Settings: NEMO_DRIVER_MODE NEMO_DRIVER_BRANCH NEMO_MIN_DRIVER_BRANCH NEMO_CUDA NEMO_DRIVER_OPEN
#           NEMO_RUNFILE_URL NEMO_RUNFILE_SHA256

step check "nvidia-smi works and its branch is >= ${NEMO_MIN_DRIVER_BRANCH} (CUDA ${NEMO_CUDA} wheels)"
read -r state detail < <(driver_status)
case $state in
  ok)
    log "driver ${detail} can run CUDA ${NEMO_CUDA}: nothing to do"
    finish "\"driver\":\"${detail}\""
    ;;
  old) log "driver ${detail} is older than branch ${NEMO_MIN_DRIVER_BRANCH}" ;;
  none) log "nvidia-smi does not work: ${detail}" ;;
esac

if [[ $NEMO_DRIVER_MODE == preinstalled ]]; then
  fail "the image's driver cannot run the vLLM wheels (${state}: ${detail}); CUDA ${NEMO_CUDA} needs branch >= ${NEMO_MIN_DRIVER_BRANCH}" \
       "set bootstrap.driver.mode to auto (install it) or use an image with a newer driver"
fi

step secure-boot "a driver installed now must be able to load"
if [[ $(cat "$STATE_DIR/secure-boot" 2>/dev/null || echo unknown) == enabled ]]; then
  fail "Secure Boot is enabled: a newly installed driver module would need MOK enrollment at the console, which cannot be automated" \
       "use an image whose driver is new enough (bootstrap.driver.mode: preinstalled) or a Droplet without Secure Boot"
fi

suffix=""
[[ $NEMO_DRIVER_OPEN == true ]] && suffix="-open"
package="nvidia-driver-${NEMO_DRIVER_BRANCH}-server${suffix}"

install_apt() {
  step apt-status "is ${package} already installed and waiting for a reboot?"
  if [[ $(dpkg-query -W -f='${db:Status-Abbrev}' "$package" 2>/dev/null) == "ii "* ]]; then
    request_reboot "${package} is installed but not loaded"
    return 0
  fi
  step apt-install "install ${package} from the Ubuntu archive"
  retry 3 timeout 600 apt-get update -q >&2 \
    || fail "apt-get update failed 3 times" "check the Droplet's outbound network and DNS, then pulumi up again"
  retry 3 timeout 1800 apt-get install -y -q --no-install-recommends \
      -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "$package" >&2 \
    || fail "apt-get install ${package} failed" \
            "check that branch ${NEMO_DRIVER_BRANCH} is packaged for this release (apt-cache policy ${package}); or use bootstrap.driver.mode: runfile"
  changed
  request_reboot "installed ${package}"
}

install_runfile() {
  local marker="$STATE_DIR/driver-runfile-${NEMO_RUNFILE_SHA256}" run=/var/cache/nemotron/nvidia-driver.run
  step runfile-status "was this runfile already installed and is waiting for a reboot?"
  if [[ -f $marker ]]; then
    request_reboot "the runfile driver is installed but not loaded"
    return 0
  fi
  step runfile-download "download and verify the NVIDIA installer"
  download "$NEMO_RUNFILE_URL" "$run" "$NEMO_RUNFILE_SHA256"
  step runfile-build-deps "install the compiler and kernel headers DKMS needs"
  retry 3 timeout 600 apt-get update -q >&2 || fail "apt-get update failed 3 times" "check outbound network and DNS"
  retry 3 timeout 1800 apt-get install -y -q --no-install-recommends build-essential dkms "linux-headers-$(uname -r)" >&2 \
    || fail "could not install build-essential, dkms and the kernel headers" "check apt on the Droplet"
  step runfile-remove-packages "remove packaged NVIDIA drivers that would conflict"
  mapfile -t packaged < <(dpkg-query -W -f='${binary:Package} ${db:Status-Abbrev}\n' 'nvidia-driver-*' 2>/dev/null | awk '$2 == "ii" {print $1}')
  if (( ${#packaged[@]} )); then
    timeout 900 apt-get purge -y -q "${packaged[@]}" >&2
  fi
  step runfile-install "run the installer: silent, DKMS, no OpenGL files"
  local module=()
  [[ $NEMO_DRIVER_OPEN == true ]] && module=(--kernel-module-type=open)
  timeout 1800 sh "$run" --silent --dkms --no-opengl-files --no-x-check "${module[@]}" >&2 \
    || fail "the NVIDIA installer failed" "read /var/log/nvidia-installer.log on the Droplet"
  touch "$marker"
  changed
  request_reboot "installed the NVIDIA runfile driver"
}

case $NEMO_DRIVER_MODE in
  auto|apt) install_apt ;;
  runfile) install_runfile ;;
  *) fail "unknown driver mode ${NEMO_DRIVER_MODE}" "use auto, preinstalled, apt or runfile" ;;
esac

finish "\"driver\":\"pending-reboot\""
