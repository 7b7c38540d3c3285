# shellcheck shell=bash
# driver: make sure the NVIDIA driver can run the CUDA of the pinned vLLM wheels, with a kernel
# module for the running kernel, and on NVSwitch sizes Fabric Manager of the driver's exact
# version. The check is always the same; what happens when it fails depends on NEMO_DRIVER_MODE.
# Installs only when the check fails, and asks for a reboot only when it installed.
# Settings: NEMO_DRIVER_MODE NEMO_DRIVER_BRANCH NEMO_MIN_DRIVER_BRANCH NEMO_CUDA NEMO_DRIVER_OPEN
#           NEMO_RUNFILE_URL NEMO_RUNFILE_SHA256 NEMO_FABRIC_MANAGER

kernel=$(uname -r)
suffix=""
[[ $NEMO_DRIVER_OPEN == true ]] && suffix="-open"
package="nvidia-driver-${NEMO_DRIVER_BRANCH}-server${suffix}"

# module_for_kernel: is there an nvidia module the running kernel can load at the next boot?
# (DKMS builds into updates/dkms, Canonical's precompiled packages into kernel/nvidia-*.)
module_for_kernel() {
  [[ -n $(find "/lib/modules/${kernel}" -name 'nvidia.ko*' -print -quit 2>/dev/null) ]]
}

# fabric_manager VERSION LOADED: install nvidia-fabricmanager-<branch> of exactly VERSION and
# enable it; start it now when the driver is LOADED (true), else at the coming boot.
fabric_manager() {
  local version=$1 loaded=$2 fm have candidate
  fm="nvidia-fabricmanager-${version%%.*}"
  step fabric-manager "NVSwitch: ${fm} of exactly the driver's version ${version}"
  have=$(dpkg-query -W -f='${Version}' "$fm" 2>/dev/null || true)
  if [[ ${have%%-*} == "$version" ]]; then
    log "${fm} ${have} is installed"
  else
    [[ -n $have ]] && log "${fm} ${have} does not match the driver ${version}: replacing it"
    retry 3 apt_get update >&2 || fail "apt-get update failed 3 times" "check outbound network and DNS"
    candidate=$(apt-cache madison "$fm" 2>/dev/null \
      | awk -F'|' -v v="$version" '{gsub(/ /, "", $2); if (index($2, v "-") == 1) {print $2; exit}}')
    if [[ -z $candidate ]]; then
      fail "no ${fm} of version ${version} in the apt sources; CUDA does not start on an NVSwitch system without Fabric Manager of the driver's exact version" \
           "use bootstrap.driver.mode: apt (the archive has a matching pair), or add NVIDIA's CUDA repository that carries ${fm}=${version}"
    fi
    retry 3 apt_get install --no-install-recommends "${fm}=${candidate}" >&2 \
      || fail "could not install ${fm}=${candidate}" "check apt on the Droplet (apt-cache madison ${fm})"
    changed
  fi
  if ! systemctl is-enabled --quiet nvidia-fabricmanager.service; then
    systemctl enable nvidia-fabricmanager.service >&2
    changed
  fi
  if [[ $loaded == true ]] && ! systemctl is-active --quiet nvidia-fabricmanager.service; then
    systemctl restart nvidia-fabricmanager.service >&2 \
      || fail "nvidia-fabricmanager did not start" "journalctl -u nvidia-fabricmanager on the Droplet shows why (a version mismatch names both)"
    changed
  fi
}

step check "nvidia-smi works and its branch is >= ${NEMO_MIN_DRIVER_BRANCH} (CUDA ${NEMO_CUDA} wheels)"
read -r state detail < <(driver_status)
case $state in
  ok)
    log "driver ${detail} can run CUDA ${NEMO_CUDA}: nothing to install"
    [[ $NEMO_FABRIC_MANAGER == true ]] && fabric_manager "$detail" true
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

install_apt() {
  local precompiled="linux-modules-nvidia-${NEMO_DRIVER_BRANCH}-server${suffix}-${kernel}" packages
  step apt-status "is ${package} already installed, with a module for ${kernel}, waiting for a reboot?"
  if [[ $(dpkg-query -W -f='${db:Status-Abbrev}' "$package" 2>/dev/null) == "ii "* ]] && module_for_kernel; then
    request_reboot "${package} is installed but not loaded"
    return 0
  fi
  step apt-update "the package lists"
  retry 3 apt_get update >&2 \
    || fail "apt-get update failed 3 times" "check the Droplet's outbound network and DNS, then pulumi up again"
  step kernel-module "a kernel module for the running kernel ${kernel}"
  # The driver package brings no module by itself: Canonical's precompiled one for this kernel
  # (signed, no build), else DKMS, whose kernel headers dkms only recommends, so name them.
  if apt-cache show "$precompiled" >/dev/null 2>&1; then
    packages=("$package" "$precompiled")
    log "precompiled module: ${precompiled}"
  else
    packages=("$package" dkms "linux-headers-${kernel}")
    log "no precompiled module for ${kernel}: DKMS builds it against linux-headers-${kernel}"
  fi
  step apt-install "install ${packages[*]}"
  retry 3 apt_get install --no-install-recommends "${packages[@]}" >&2 \
    || fail "apt-get install ${packages[*]} failed" \
            "check that branch ${NEMO_DRIVER_BRANCH} is packaged for this release (apt-cache policy ${package}); or use bootstrap.driver.mode: runfile"
  changed
  step module "the install left an nvidia module for ${kernel}"
  module_for_kernel \
    || fail "${package} is installed but there is no nvidia kernel module for the running kernel ${kernel}" \
            "read the DKMS build log on the Droplet (/var/lib/dkms/nvidia/*/build/make.log); pulumi up again retries"
  request_reboot "installed ${package}"
}

install_runfile() {
  local marker="$STATE_DIR/driver-runfile-${NEMO_RUNFILE_SHA256}" run=/var/cache/nemotron/nvidia-driver.run
  step runfile-status "was this runfile already installed and is waiting for a reboot?"
  if [[ -f $marker ]] && module_for_kernel; then
    request_reboot "the runfile driver is installed but not loaded"
    return 0
  fi
  step runfile-download "download and verify the NVIDIA installer"
  download "$NEMO_RUNFILE_URL" "$run" "$NEMO_RUNFILE_SHA256"
  step runfile-build-deps "install the compiler and kernel headers DKMS needs"
  apt_install build-essential dkms "linux-headers-${kernel}" \
    || fail "could not install build-essential, dkms and the kernel headers" "check apt on the Droplet"
  step runfile-remove-packages "remove packaged NVIDIA drivers that would conflict"
  mapfile -t packaged < <(dpkg-query -W -f='${binary:Package} ${db:Status-Abbrev}\n' 'nvidia-driver-*' 2>/dev/null | awk '$2 == "ii" {print $1}')
  if (( ${#packaged[@]} )); then
    APT_SECONDS=900 apt_get purge "${packaged[@]}" >&2
  fi
  step runfile-install "run the installer: silent, DKMS, no OpenGL files"
  local module=()
  [[ $NEMO_DRIVER_OPEN == true ]] && module=(--kernel-module-type=open)
  bounded 1800 sh "$run" --silent --dkms --no-opengl-files --no-x-check "${module[@]}" >&2 \
    || fail "the NVIDIA installer failed" "read /var/log/nvidia-installer.log on the Droplet"
  module_for_kernel \
    || fail "the NVIDIA installer left no kernel module for ${kernel}" "read /var/log/nvidia-installer.log on the Droplet"
  touch "$marker"
  changed
  request_reboot "installed the NVIDIA runfile driver"
}

case $NEMO_DRIVER_MODE in
  auto|apt) install_apt ;;
  runfile) install_runfile ;;
  *) fail "unknown driver mode ${NEMO_DRIVER_MODE}" "use auto, preinstalled, apt or runfile" ;;
esac

if [[ $NEMO_FABRIC_MANAGER == true ]]; then
  if [[ $NEMO_DRIVER_MODE == runfile ]]; then
    installed=$(basename "$NEMO_RUNFILE_URL" .run)
    installed=${installed##*-}
  else
    installed=$(dpkg-query -W -f='${Version}' "$package")
    installed=${installed%%-*}
  fi
  fabric_manager "$installed" false
fi

finish "\"driver\":\"pending-reboot\""
