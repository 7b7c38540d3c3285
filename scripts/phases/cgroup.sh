# shellcheck shell=bash
# cgroup: vLLM and the NVIDIA container toolkit run on cgroup v2. `unified` only verifies it;
# `legacy` applies the seed article's cgroup v1 switch through a GRUB drop-in and asks for a reboot.
# Settings: NEMO_CGROUP_MODE

flag=systemd.unified_cgroup_hierarchy=0
dropin=/etc/default/grub.d/90-nemotron-cgroup.cfg

if [[ $NEMO_CGROUP_MODE == unified ]]; then
  step verify "cgroup v2 mounted with the memory controller"
  fstype=$(stat -fc %T /sys/fs/cgroup)
  if [[ $fstype != cgroup2fs ]]; then
    fail "/sys/fs/cgroup is ${fstype}, not cgroup v2" \
         "remove ${flag} from the kernel command line (GRUB), reboot, or set bootstrap.cgroup.mode: legacy"
  fi
  if ! grep -qw memory /sys/fs/cgroup/cgroup.controllers; then
    fail "cgroup v2 has no memory controller (controllers: $(< /sys/fs/cgroup/cgroup.controllers))" \
         "remove cgroup_disable=memory from the kernel command line and reboot"
  fi
  log "cgroup v2 with controllers: $(< /sys/fs/cgroup/cgroup.controllers)"
  finish "\"cgroup\":\"v2\""
fi

step systemd "cgroup v1 needs systemd older than 256"
systemd_version=$(systemctl --version | awk 'NR == 1 {print $2}')
if (( systemd_version >= 256 )); then
  fail "systemd ${systemd_version} no longer boots with cgroup v1" "set bootstrap.cgroup.mode: unified (vLLM does not need v1)"
fi

step grub "kernel command line with ${flag}"
if grep -qw "$flag" /proc/cmdline; then
  log "already booted with ${flag}"
  finish "\"cgroup\":\"v1\""
fi
mkdir -p "$(dirname "$dropin")"
# shellcheck disable=SC2016  # GRUB expands ${GRUB_CMDLINE_LINUX} itself
if printf 'GRUB_CMDLINE_LINUX="${GRUB_CMDLINE_LINUX} %s"\n' "$flag" | install_file "$dropin" 644; then
  bounded 300 update-grub >&2
  changed
fi
request_reboot "${flag} takes effect at the next boot"
finish "\"cgroup\":\"v1-pending-reboot\""
