# shellcheck shell=bash
# cache: the block-storage Volume that outlives the Droplet. Formats it only when it is new,
# mounts it (fstab, nofail: a missing Volume never holds the boot), and binds its folders where
# the other phases and the service already look (conda, the HF cache, the vLLM user's compile
# caches), so that they find what an earlier Droplet left and skip. A Droplet that already had
# them (a cache turned on later) copies them in first. With no cache configured, undoes what an
# earlier run set up; the later phases then install on the boot disk again.
# Settings: NEMO_CACHE_DEVICE (empty: no cache) NEMO_CACHE_MOUNT NEMO_CACHE_LABEL
#           NEMO_CACHE_BINDS (folder-on-volume:path ...) NEMO_CACHE_WAIT_SECONDS NEMO_VLLM_UNIT

fstab=/etc/fstab
begin="# nemotron-cache: begin (the bootstrap's cache phase writes this block)"
end="# nemotron-cache: end"
state_file=$STATE_DIR/cache.state
mnt=$NEMO_CACHE_MOUNT
mkdir -p "$STATE_DIR"

# fstab_without_block: /etc/fstab without our block, on stdout.
fstab_without_block() {
  [[ -f $fstab ]] || return 0
  awk -v b="$begin" -v e="$end" '$0 == b {skip = 1; next} $0 == e {skip = 0; next} !skip' "$fstab"
}

if [[ -z $NEMO_CACHE_DEVICE ]]; then
  step off "no cache Volume for this Droplet"
  if grep -qxF "$begin" "$fstab" 2>/dev/null || mountpoint -q "$mnt"; then
    # vLLM runs from the bound folders: stop it before they go (the service phase starts it
    # again from the boot disk, once the later phases have put it there).
    log "the cache is no longer used: stopping ${NEMO_VLLM_UNIT} and unmounting ${mnt}"
    systemctl stop "$NEMO_VLLM_UNIT" >&2 2>/dev/null || true
    for (( i = ${#NEMO_CACHE_BINDS[@]} - 1; i >= 0; i-- )); do
      target=${NEMO_CACHE_BINDS[i]#*:}
      if mountpoint -q "$target"; then umount "$target"; fi
    done
    if mountpoint -q "$mnt"; then umount "$mnt"; fi
    fstab_without_block | install_file "$fstab" 644 || true
    changed
  fi
  printf 'off\n' > "$state_file"
  finish '"cache":"off"'
fi

step attached "the Volume at ${NEMO_CACHE_DEVICE} (at most ${NEMO_CACHE_WAIT_SECONDS}s for it to appear)"
deadline=$((SECONDS + NEMO_CACHE_WAIT_SECONDS))
until [[ -e $NEMO_CACHE_DEVICE ]]; do
  if (( SECONDS >= deadline )); then
    fail "no ${NEMO_CACHE_DEVICE}: the cache Volume is not attached to this Droplet" \
         "check Volumes in the control panel (attached to this Droplet, same region); pulumi up again"
  fi
  sleep 2
done
device=$(readlink -f "$NEMO_CACHE_DEVICE")

step filesystem "format the Volume only if it is new"
fs_type=$(blkid -p -s TYPE -o value "$device" 2>/dev/null || true)
table=$(blkid -p -s PTTYPE -o value "$device" 2>/dev/null || true)
fresh=false
if [[ -z $fs_type && -z $table ]]; then
  log "a new, empty Volume: formatting it ext4 (label ${NEMO_CACHE_LABEL})"
  # -m 0: a cache needs no blocks kept for root; lazy init: seconds, not minutes, for a big one.
  mkfs.ext4 -q -F -m 0 -L "$NEMO_CACHE_LABEL" -E lazy_itable_init=1,lazy_journal_init=1 "$device" >&2
  fresh=true
  changed
elif [[ $fs_type != ext4 ]]; then
  fail "the Volume holds ${fs_type:-a ${table} partition table}, not the ext4 cache this program makes; it is not formatted over" \
       "attach an empty Volume, or delete this one in the control panel (its data is lost) and pulumi up again"
else
  log "the Volume holds an ext4 filesystem: using it as it is"
fi
uuid=$(blkid -p -s UUID -o value "$device")

step fstab "mount entries that survive the reboot (nofail: a missing Volume never holds the boot)"
{
  fstab_without_block
  printf '%s\n' "$begin"
  printf 'UUID=%s %s ext4 defaults,nofail,noatime,discard,x-systemd.device-timeout=30s 0 2\n' "$uuid" "$mnt"
  for bind in "${NEMO_CACHE_BINDS[@]}"; do
    printf '%s/%s %s none bind,nofail,x-systemd.requires-mounts-for=%s 0 0\n' "$mnt" "${bind%%:*}" "${bind#*:}" "$mnt"
  done
  printf '%s\n' "$end"
} | install_file "$fstab" 644 && changed

step mount "the Volume at ${mnt}"
if mountpoint -q "$mnt"; then
  log "${mnt} is mounted"
else
  mkdir -p "$mnt"
  mount -o defaults,noatime,discard "$device" "$mnt" \
    || fail "could not mount ${device} at ${mnt}" "read dmesg on the Droplet; pulumi up again"
  changed
fi
if [[ -b $device ]]; then
  # cache.sizeGb grew: DigitalOcean resized the device, the filesystem follows (online).
  device_bytes=$(blockdev --getsize64 "$device")
  fs_bytes=$(dumpe2fs -h "$device" 2>/dev/null | awk -F: '/^Block count/ {c=$2} /^Block size/ {s=$2} END {print c * s}')
  if (( device_bytes > fs_bytes + 64 * 1024 * 1024 )); then
    log "the Volume grew to $((device_bytes >> 30)) GiB: growing its filesystem"
    resize2fs "$device" >&2
    changed
  fi
fi

step layout "the cache's record"
record=$mnt/.nemotron-cache
if [[ ! -s $record ]]; then
  printf 'layout 1\ncreated %s\n' "$(date -u +%FT%TZ)" > "$record"
  fresh=true
fi
created=$(awk '$1 == "created" {print $2}' "$record")

step bind "the cache's folders where the phases and the service look"
for bind in "${NEMO_CACHE_BINDS[@]}"; do
  source_dir=$mnt/${bind%%:*} target=${bind#*:}
  mkdir -p "$source_dir" "$target"
  if mountpoint -q "$target"; then
    log "${target}: bound"
    continue
  fi
  if [[ -z $(ls -A "$source_dir") && -n $(ls -A "$target") ]]; then
    # What this Droplet already has (the cache was turned on later): a copy, not a download.
    # Into a side folder first, renamed when whole: a copy cut short (the phase's bound, a lost
    # connection) leaves the cache's folder empty, and the next run copies again.
    log "${target}: copying what this Droplet has into the cache ($(du -sh "$target" | cut -f1))"
    rm -rf "${source_dir}.partial"
    mkdir -p "${source_dir}.partial"
    cp -a "$target/." "${source_dir}.partial/"
    rmdir "$source_dir"
    mv "${source_dir}.partial" "$source_dir"
  fi
  mount --bind "$source_dir" "$target"
  changed
done

used=$(df --output=used -BG "$mnt" | tail -n 1 | tr -dc '0-9')
size=$(df --output=size -BG "$mnt" | tail -n 1 | tr -dc '0-9')
if [[ $fresh == true ]]; then
  state=new
  log "a new cache: the vllm and model phases fill it (${used} of ${size} GB used)"
else
  state=warm
  log "a warm cache from ${created}: ${used} of ${size} GB used; the phases check what it holds and skip what is complete"
fi
printf '%s %s\n' "$state" "$created" > "$state_file"
finish "\"cache\":\"${state}\",\"created\":\"${created}\",\"used_gb\":${used:-0},\"size_gb\":${size:-0}"
