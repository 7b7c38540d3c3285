# shellcheck shell=bash
# preflight: is this host ready for the rest? Waits for first-boot work, then checks the OS,
# free disk, the GPU on the PCI bus and Secure Boot, and lists the disks. Changes nothing but
# its own records.
# Settings: NEMO_OS_RELEASES NEMO_DISK_NEED_GB NEMO_GPU_COUNT NEMO_WAIT_SECONDS
# NEMO_FIRST_BOOTSTRAP_FILE NEMO_VOLUME_DEVICE_PREFIX

step first-bootstrap "record when this Droplet's first bootstrap began (autodown's maxHours)"
if [[ -s $NEMO_FIRST_BOOTSTRAP_FILE ]]; then
  log "first bootstrap began $(date -u -d "@$(<"$NEMO_FIRST_BOOTSTRAP_FILE")" '+%F %T UTC' 2>/dev/null || echo '(unreadable record)')"
else
  mkdir -p "$(dirname "$NEMO_FIRST_BOOTSTRAP_FILE")"
  date +%s > "${NEMO_FIRST_BOOTSTRAP_FILE}.tmp"
  mv "${NEMO_FIRST_BOOTSTRAP_FILE}.tmp" "$NEMO_FIRST_BOOTSTRAP_FILE"
  log "first bootstrap of this Droplet: recorded"
fi

step cloud-init "wait for first-boot configuration to finish (at most ${NEMO_WAIT_SECONDS}s)"
if command -v cloud-init >/dev/null; then
  # 0: done; 2: done with recoverable errors. Either way it no longer holds apt.
  status=0
  bounded "$NEMO_WAIT_SECONDS" cloud-init status --wait >/dev/null 2>&1 || status=$?
  case $status in
    0|2) log "cloud-init is done" ;;
    124) fail "cloud-init still running after ${NEMO_WAIT_SECONDS}s" \
              "look at /var/log/cloud-init-output.log on the Droplet, then pulumi up again" ;;
    *) log "cloud-init status exited ${status}; going on" ;;
  esac
else
  log "no cloud-init on this image"
fi

step apt-locks "wait until no apt/dpkg process holds the package locks"
deadline=$((SECONDS + NEMO_WAIT_SECONDS))
locks=(/var/lib/dpkg/lock-frontend /var/lib/dpkg/lock /var/lib/apt/lists/lock /var/cache/apt/archives/lock)
while fuser "${locks[@]}" >/dev/null 2>&1; do
  if (( SECONDS >= deadline )); then
    fail "the package locks are still held after ${NEMO_WAIT_SECONDS}s (unattended-upgrades?)" \
         "wait for it to finish (systemctl status unattended-upgrades) and pulumi up again"
  fi
  sleep 5
done
log "package locks are free"

step os "check the OS release"
# shellcheck source=/dev/null
. /etc/os-release
if [[ ${ID:-} != ubuntu ]] || [[ " ${NEMO_OS_RELEASES} " != *" ${VERSION_ID:-} "* ]]; then
  fail "this is ${PRETTY_NAME:-an unknown OS}; the phases support Ubuntu ${NEMO_OS_RELEASES}" \
       "use a GPU base image (droplet.image: gpu-h100x1-base) or an Ubuntu ${NEMO_OS_RELEASES// / or } image"
fi
log "OS: ${PRETTY_NAME}"

step disk "check free disk for the vLLM env and the model (${NEMO_DISK_NEED_GB} GB)"
free_gb=$(df --output=avail -BG /var/lib | tail -n 1 | tr -dc '0-9')
if (( free_gb < NEMO_DISK_NEED_GB )); then
  fail "${free_gb} GB free on /var/lib, ${NEMO_DISK_NEED_GB} GB needed for the vLLM env and the weights" \
       "choose a size with a larger disk, or a smaller model (model.id)"
fi
log "disk: ${free_gb} GB free"

step disks "list the disks this Droplet sees: its boot disk, a scratch disk, Volumes"
# DigitalOcean documents a GPU size's scratch disk (the sizes API's disk_info) but not where it
# appears on the Droplet (docs/facts.md): a line per disk says it, in the bootstrap's log and
# its timeline. Reads only.
disks=""
if command -v lsblk >/dev/null; then
  while read -r name bytes; do
    # A name of other characters is not a kernel disk name: skipped, never quoted into JSON.
    [[ $name =~ ^[a-z0-9]+$ ]] || continue
    # A disk gone since the list (or no /dev node for it) lists nothing: it fails no phase.
    mounts=$({ lsblk -nr -o MOUNTPOINT "/dev/${name}" 2>/dev/null || true; } | awk 'NF' | paste -sd, - | tr -dc 'A-Za-z0-9/_.,-')
    fs=$({ lsblk -nr -o FSTYPE "/dev/${name}" 2>/dev/null || true; } | awk 'NF' | sort -u | paste -sd, - | tr -dc 'A-Za-z0-9_.,-')
    volume=false
    for link in "${NEMO_VOLUME_DEVICE_PREFIX}"*; do
      if [[ -e $link && $(readlink -f "$link") == "/dev/${name}" ]]; then volume=true; fi
    done
    what="${fs:-no filesystem}, not mounted"
    if [[ -n $mounts ]]; then what="${fs:-no filesystem}, mounted at ${mounts}"; fi
    if [[ $volume == true ]]; then what+=", a DigitalOcean Volume"; fi
    log "disk ${name}: $(( bytes / 1073741824 )) GiB, ${what}"
    disks+="${disks:+,}{\"name\":\"${name}\",\"gib\":$(( bytes / 1073741824 )),\"mounts\":\"${mounts}\",\"volume\":${volume}}"
  done < <(lsblk -dnb -o NAME,SIZE,TYPE 2>/dev/null | awk '$3 == "disk" && $2 > 0 {print $1, $2}')
else
  log "no lsblk here: the disks are not listed"
fi

step gpu "look for NVIDIA GPUs on the PCI bus"
gpus=0
if (( NEMO_GPU_COUNT == 0 )); then
  log "a CPU host (the balancer): no GPU expected"
fi
for dev in /sys/bus/pci/devices/*; do
  [[ -r $dev/vendor && -r $dev/class ]] || continue
  # vendor 0x10de (NVIDIA), class 0x03xxxx (display/3D controller)
  if [[ $(<"$dev/vendor") == 0x10de && $(<"$dev/class") == 0x03* ]]; then
    gpus=$((gpus + 1))
  fi
done
if (( gpus == 0 && NEMO_GPU_COUNT > 0 )); then
  fail "no NVIDIA GPU on the PCI bus" \
       "the Droplet is not a GPU size or its GPU is not attached: pulumi destroy, then pulumi up (droplet.size must be a GPU size)"
fi
if (( gpus < NEMO_GPU_COUNT )); then
  fail "${gpus} NVIDIA GPU(s) on the PCI bus, the size has ${NEMO_GPU_COUNT}" \
       "a GPU is missing from the Droplet: recreate it (pulumi up --replace on the droplet)"
fi
log "GPUs on the PCI bus: ${gpus}"

step secure-boot "read the Secure Boot state"
sb=unknown
if command -v mokutil >/dev/null; then
  case $(mokutil --sb-state 2>&1) in
    *"SecureBoot enabled"*) sb=enabled ;;
    *"SecureBoot disabled"*) sb=disabled ;;
    *"not supported"*) sb=unsupported ;;
  esac
else
  vars=(/sys/firmware/efi/efivars/SecureBoot-*)
  var=${vars[0]}
  if [[ -e $var ]]; then
    # The last byte of the variable is 1 when Secure Boot is on.
    [[ $(od -An -t u1 "$var" | awk '{print $NF}') == 1 ]] && sb=enabled || sb=disabled
  elif [[ ! -d /sys/firmware/efi ]]; then
    sb=unsupported
  fi
fi
printf '%s\n' "$sb" > "$STATE_DIR/secure-boot"
log "Secure Boot: ${sb} (unsigned kernel modules load only when it is not enabled)"

finish "\"gpus\":${gpus},\"disk_free_gb\":${free_gb},\"disks\":[${disks}],\"secure_boot\":\"${sb}\""
