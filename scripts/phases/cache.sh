# shellcheck shell=bash
# cache: the block-storage Volume that outlives the Droplet. Formats it only when it reads as new
# (zeros wherever a filesystem, a partition table or volume metadata would be), grows its
# filesystem when the Volume grew, mounts it (fstab, nofail: a missing Volume never holds the
# boot), and binds its folders where the other phases and the service already look (conda, the
# HF cache, the vLLM user's compile caches), so that they find what an earlier Droplet left and
# skip. A Droplet that already had them (a cache turned on later) copies them in first; a folder
# is bound, and enters fstab, only once its copy is whole. With no cache configured, undoes what
# an earlier run set up; the later phases then install on the boot disk again.
# Settings: NEMO_CACHE_DEVICE (empty: no cache) NEMO_CACHE_MOUNT NEMO_CACHE_LABEL
#           NEMO_CACHE_BINDS (folder-on-volume:path ...) NEMO_CACHE_WAIT_SECONDS NEMO_VLLM_UNIT
#           NEMO_CACHE_SIZE_GB NEMO_CACHE_COPY_SECONDS

fstab=/etc/fstab
begin="# nemotron-cache: begin (the bootstrap's cache phase writes this block)"
end="# nemotron-cache: end"
state_file=$STATE_DIR/cache.state
mnt=$NEMO_CACHE_MOUNT
# One file per folder of the Volume that is a complete copy (written after the copy's rename):
# only those are bound. Beside the folders, not in them: the phases empty what they reinstall.
complete_dir=$mnt/.nemotron-complete
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

# volume_bytes: the Volume's size as the kernel sees it (the tests' Volumes are image files).
volume_bytes() {
  if [[ -b $device ]]; then blockdev --getsize64 "$device"; else stat -c %s "$device"; fi
}

# signatures: what wipefs finds on the Volume (filesystems, partition tables, RAID and LVM
# metadata: every signature libblkid knows, even where blkid -p gives up on an ambivalent
# result), as "type at offset; ...", or nothing.
signatures() {
  { wipefs --no-act --noheadings --output TYPE,OFFSET "$device" 2>/dev/null || true; } \
    | awk '{printf "%s%s at %s", sep, $1, $2; sep = "; "}'
}

# nonzero_in OFFSET LENGTH: sets nonzero to the offset of the first byte in that range that is
# not zero; leaves it as it is when they all are. cmp counts bytes from 1 after what it skips.
nonzero_in() {
  local offset=$1 length=$2 out rc=0
  out=$(bounded 300 cmp -n "$length" -i "${offset}:0" "$device" /dev/zero 2>&1) || rc=$?
  if (( rc == 0 )); then return 0; fi
  if (( rc == 1 )) && [[ $out =~ differ:\ (byte|char)\ ([0-9]+) ]]; then
    nonzero=$(( offset + BASH_REMATCH[2] - 1 ))
    return 0
  fi
  fail "could not read the Volume to check that it is new: ${out}" "read dmesg on the Droplet; pulumi up again"
}

# find_data: sets nonzero to where the Volume holds data, or "" when it reads as new. Partition
# tables, superblocks, the GPT backup and md/LVM metadata sit in its first and last MiBs, so the
# whole first and last 64 MiB are read; in between, 1 MiB every GiB (a 1000 GB Volume: about
# 1 GB read, seconds). A new DigitalOcean Volume reads as zeros. No command substitution here:
# a failed read must stop the phase, never pass for zeros.
find_data() {
  local bytes window=$((64 << 20)) sample=$((1 << 20)) step=$((1 << 30)) offset
  bytes=$(volume_bytes)
  if (( window > bytes )); then window=$bytes; fi
  nonzero=""
  nonzero_in 0 "$window"
  for (( offset = step; offset + sample <= bytes - window; offset += step )); do
    [[ -z $nonzero ]] || return 0
    nonzero_in "$offset" "$sample"
  done
  [[ -n $nonzero ]] || nonzero_in $((bytes - window)) "$window"
}

step filesystem "format the Volume only if it reads as new"
fs_type=$(blkid -p -s TYPE -o value "$device" 2>/dev/null || true)
table=$(blkid -p -s PTTYPE -o value "$device" 2>/dev/null || true)
fresh=false
clear_it="if what it holds is not wanted, clear it on purpose: blkdiscard ${device} on this Droplet (nothing mounts it now; wipefs -a alone leaves the data further in), or delete the Volume in the control panel (the next pulumi up makes a new, empty one); then pulumi up again"
if [[ $fs_type == ext4 ]]; then
  log "the Volume holds an ext4 filesystem: using it as it is"
elif [[ -n $fs_type || -n $table ]]; then
  fail "the Volume holds ${fs_type:-a ${table} partition table} (wipefs: $(signatures)), not the ext4 cache this program makes; it is not formatted over" \
       "attach an empty Volume, or delete this one in the control panel (its data is lost) and pulumi up again"
else
  found=$(signatures)
  if [[ -n $found ]]; then
    fail "blkid names no filesystem on the Volume, but wipefs finds ${found}; it is not formatted over" "$clear_it"
  fi
  find_data
  if [[ -n $nonzero ]]; then
    fail "the Volume holds no filesystem blkid knows, but it is not new: the byte at offset ${nonzero} ($(numfmt --to=iec-i --suffix=B "$nonzero")) is not zero; formatting would discard what it holds" "$clear_it"
  fi
  log "a new Volume (zeros in its first and last 64 MiB and in a MiB of every GiB): formatting it ext4 (label ${NEMO_CACHE_LABEL})"
  # -m 0: a cache needs no blocks kept for root; lazy init: seconds, not minutes, for a big one.
  mkfs.ext4 -q -F -m 0 -L "$NEMO_CACHE_LABEL" -E lazy_itable_init=1,lazy_journal_init=1 "$device" >&2
  fresh=true
  changed
fi
uuid=$(blkid -p -s UUID -o value "$device")

step mount "the Volume at ${mnt}"
if mountpoint -q "$mnt"; then
  log "${mnt} is mounted"
else
  mkdir -p "$mnt"
  mount -o defaults,noatime,discard "$device" "$mnt" \
    || fail "could not mount ${device} at ${mnt}" "read dmesg on the Droplet; pulumi up again"
  changed
fi

# filesystem_bytes: what the ext4 filesystem on the Volume spans.
filesystem_bytes() {
  dumpe2fs -h "$device" 2>/dev/null \
    | awk -F: '/^Block count/ {c = $2} /^Block size/ {s = $2} END {printf "%.0f\n", c * s}'
}

step grow "the filesystem, when the Volume grew (cache.sizeGb ${NEMO_CACHE_SIZE_GB})"
before=$(volume_bytes)
# DigitalOcean grows a Volume in place (docs/facts.md: a resize action); the kernel reads a SCSI
# disk's new capacity when told to rescan it (Linux drivers/scsi/scsi_sysfs.c, store_rescan_field).
rescan=/sys/class/block/${device##*/}/device/rescan
if [[ -b $device && -w $rescan ]]; then echo 1 > "$rescan"; fi
bytes=$(volume_bytes)
fs_bytes=$(filesystem_bytes)
if (( bytes > fs_bytes + (64 << 20) )); then
  seen=""
  if (( before != bytes )); then seen=" (the kernel saw $(numfmt --to=iec-i --suffix=B "$before") until its rescan)"; fi
  log "the Volume grew to $(numfmt --to=iec-i --suffix=B "$bytes")${seen}: growing its ext4 filesystem from $(numfmt --to=iec-i --suffix=B "$fs_bytes") with resize2fs, online"
  bounded 1800 resize2fs "$device" >&2 \
    || fail "resize2fs could not grow the filesystem to the Volume's $(numfmt --to=iec-i --suffix=B "$bytes")" \
            "read the lines above and dmesg on the Droplet; pulumi up again"
  changed
elif (( bytes < NEMO_CACHE_SIZE_GB << 30 )); then
  # The plan attaches a Volume it adopts at its own size first (components/cloud/cache.py, plan).
  log "the filesystem spans the Volume's $(numfmt --to=iec-i --suffix=B "$bytes"); it grows to ${NEMO_CACHE_SIZE_GB} GiB on the next pulumi up (the cache output's note says why)"
else
  log "the filesystem spans the Volume's $(numfmt --to=iec-i --suffix=B "$bytes")"
fi

step layout "the cache's record"
record=$mnt/.nemotron-cache
if [[ ! -s $record ]]; then
  printf 'layout 1\ncreated %s\n' "$(date -u +%FT%TZ)" > "$record"
  fresh=true
fi
created=$(awk '$1 == "created" {print $2}' "$record")
mkdir -p "$complete_dir"

# write_fstab: our block, the Volume and each bind whose folder is a complete copy (a bind of
# an incomplete one would hide this Droplet's own folder from the next boot on); says whether
# it changed.
write_fstab() {
  local bind
  {
    fstab_without_block
    printf '%s\n' "$begin"
    printf 'UUID=%s %s ext4 defaults,nofail,noatime,discard,x-systemd.device-timeout=30s 0 2\n' "$uuid" "$mnt"
    for bind in "${NEMO_CACHE_BINDS[@]}"; do
      [[ -f $complete_dir/${bind%%:*} ]] || continue
      printf '%s/%s %s none bind,nofail,x-systemd.requires-mounts-for=%s 0 0\n' "$mnt" "${bind%%:*}" "${bind#*:}" "$mnt"
    done
    printf '%s\n' "$end"
  } | install_file "$fstab" 644
}

step fstab "mount entries that survive the reboot: the Volume, and the binds of complete copies"
if write_fstab; then changed; fi

# bound_from SOURCE TARGET: whether TARGET is a bind of SOURCE (the same folder, seen twice).
bound_from() {
  mountpoint -q "$2" && [[ $(stat -c %d:%i "$2") == "$(stat -c %d:%i "$1")" ]]
}

# unbind TARGET WHY: this Droplet's own folder at TARGET again. vLLM may run from what is bound
# there: when the unmount finds it busy, vLLM stops first (the service phase starts it again).
unbind() {
  log "${1}: ${2}: unbinding it"
  if ! umount "$1" 2>/dev/null; then
    log "${1} is in use: stopping ${NEMO_VLLM_UNIT} first"
    systemctl stop "$NEMO_VLLM_UNIT" >&2 2>/dev/null || true
    umount "$1" || fail "could not unbind ${1}" "find what holds it (fuser -vm ${1}), stop it, and pulumi up again"
  fi
  changed
}

# copy_in SOURCE TARGET: what this Droplet has at TARGET, copied into the Volume's SOURCE. Into
# a side folder first, renamed when whole: a copy cut short (out of space, the phase's bound, a
# lost connection) leaves SOURCE empty and unmarked, and the next run copies again.
copy_in() {
  local source_dir=$1 target=$2 need_kb free_kb
  rm -rf "${source_dir}.partial"
  need_kb=$(bounded 600 du -sk "$target" | cut -f1)
  free_kb=$(df --output=avail -k "$mnt" | tail -n 1 | tr -dc '0-9')
  if (( need_kb > free_kb )); then
    fail "${target} holds $(numfmt --to=iec-i --suffix=B $((need_kb << 10))), the cache has $(numfmt --to=iec-i --suffix=B $((free_kb << 10))) free: not copied (this Droplet keeps its own ${target}, unbound)" \
         "raise cache.sizeGb (the Volume and its filesystem grow in place) and pulumi up again"
  fi
  log "${target}: copying what this Droplet has into the cache ($(numfmt --to=iec-i --suffix=B $((need_kb << 10))))"
  mkdir -p "${source_dir}.partial"
  if ! bounded "$NEMO_CACHE_COPY_SECONDS" cp -a "$target/." "${source_dir}.partial/"; then
    rm -rf "${source_dir}.partial"
    fail "copying ${target} into the cache failed or ran past ${NEMO_CACHE_COPY_SECONDS}s; this Droplet keeps its own ${target} (not bound, not in ${fstab})" \
         "read the lines above (no space left: raise cache.sizeGb); pulumi up again copies it again"
  fi
  rmdir "$source_dir"
  mv "${source_dir}.partial" "$source_dir"
  changed
}

# complete FOLDER TARGET: make the Volume's FOLDER a complete copy of what this Droplet has at
# TARGET, and mark it so.
complete() {
  local source_dir=$mnt/$1 target=$2 how
  if [[ -n $(ls -A "$source_dir") ]]; then
    # Unmarked but filled: a copy renamed whole just before a run was cut, or a folder an
    # earlier version of this phase made (it, too, renamed only whole copies; the phases filled
    # the rest through the bind and check what it holds). Bound or not, it is the cache's.
    how="kept what the cache holds"
  else
    # Empty: what an earlier version bound (and listed in fstab) before its copy was whole,
    # hiding this Droplet's own folder. Look at that folder again, and copy it if it holds any.
    if mountpoint -q "$target"; then unbind "$target" "the cache's ${1} is empty, not a copy of this Droplet's"; fi
    if [[ -n $(ls -A "$target") ]]; then
      copy_in "$source_dir" "$target"
      how="copied from ${target} of $(hostname)"
    else
      how="empty: this Droplet had nothing at ${target}"
    fi
  fi
  printf '%s %s\n' "$(date -u +%FT%TZ)" "$how" > "$complete_dir/$1"
  log "${target}: the cache's ${1} is complete (${how})"
  changed
}

step bind "the cache's complete folders where the phases and the service look"
for bind in "${NEMO_CACHE_BINDS[@]}"; do
  folder=${bind%%:*} target=${bind#*:}
  mkdir -p "$mnt/$folder" "$target"
  if [[ ! -f $complete_dir/$folder ]]; then
    complete "$folder" "$target"
    write_fstab || true
  fi
  if bound_from "$mnt/$folder" "$target"; then
    log "${target}: bound"
    continue
  fi
  if mountpoint -q "$target"; then unbind "$target" "something else is mounted there"; fi
  mount --bind "$mnt/$folder" "$target"
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
