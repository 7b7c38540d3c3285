# shellcheck shell=bash
# reboot-wait: runs once SSH answers again. Proves the reboot happened (a new boot id) and that
# what it was for took effect: the driver is loaded, the cgroup switch is on the command line.
# Settings: NEMO_REBOOTING NEMO_PREVIOUS_BOOT_ID NEMO_MIN_DRIVER_BRANCH NEMO_CUDA NEMO_CGROUP_MODE
#           NEMO_FABRIC_MANAGER

step boot-id "compare the boot id with the one before the reboot"
now=$(boot_id)
if [[ $NEMO_REBOOTING == true ]]; then
  if [[ $now == "$NEMO_PREVIOUS_BOOT_ID" ]]; then
    fail "the boot id is still ${now}: the Droplet did not reboot" \
         "reboot it (pulumi up again, or from the DigitalOcean console) and check systemctl status nemotron-reboot.timer"
  fi
  log "rebooted: boot ${NEMO_PREVIOUS_BOOT_ID} -> ${now}"
else
  log "no reboot was needed (boot ${now})"
fi

step driver "the driver is loaded and new enough"
read -r state detail < <(driver_status)
if [[ $state != ok ]]; then
  fail "after the reboot the driver still does not work (${state}: ${detail})" \
       "on the Droplet read: dmesg | grep -i nvidia; journalctl -b -k; the DKMS build log under /var/lib/dkms"
fi
log "driver ${detail} runs CUDA ${NEMO_CUDA}"

if [[ $NEMO_FABRIC_MANAGER == true ]]; then
  step fabric-manager "nvidia-fabricmanager runs beside driver ${detail} (NVSwitch: CUDA needs it)"
  systemctl is-active --quiet nvidia-fabricmanager.service \
    || systemctl start nvidia-fabricmanager.service >&2 \
    || fail "nvidia-fabricmanager did not start with driver ${detail}" \
            "journalctl -u nvidia-fabricmanager on the Droplet names the versions; the driver phase installs the matching one on pulumi up"
  log "nvidia-fabricmanager is active"
fi

step cgroup "the cgroup mode asked for is the one booted"
if [[ $NEMO_CGROUP_MODE == legacy ]] && ! grep -qw systemd.unified_cgroup_hierarchy=0 /proc/cmdline; then
  fail "booted without systemd.unified_cgroup_hierarchy=0" "check /etc/default/grub.d/90-nemotron-cgroup.cfg and run update-grub"
fi
finish "\"driver\":\"${detail}\""
