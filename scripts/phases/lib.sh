# shellcheck shell=bash
# lib.sh: what every phase shares. The program sends, on stdin to `bash -s`, the settings
# (NEMO_* variables, shell-quoted), then this file, then the phase's own script.
#
# Conventions: stdout carries exactly one line, the phase's JSON result, printed last; every log
# line goes to stderr as `[phase] ...`. A failure names the phase, the step and the fix.

set -Eeuo pipefail
umask 022
# sshd passes almost no environment: set what the phases rely on.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export LC_ALL=C.UTF-8 DEBIAN_FRONTEND=noninteractive NEEDRESTART_MODE=a

: "${PHASE:?the settings must name the phase}"
STEP=start
CHANGED=false
PHASE_STARTED=$(date +%s%N)
STATE_DIR=/var/lib/nemotron
# Reboot requests live under /run, which the reboot itself empties.
REBOOT_DIR=/run/nemotron/reboot-required.d

log() { printf '[%s] %s\n' "$PHASE" "$*" >&2; }

# step NAME [what it does]
step() {
  STEP=$1
  shift
  log "step ${STEP}${1:+: $*}"
}

changed() { CHANGED=true; }

# fail WHAT FIX: stop the phase with a message that says what went wrong and what to do.
fail() {
  past_bound && stopped_at_bound
  trap - ERR
  printf '[%s] FAILED at step %s: %s\n' "$PHASE" "$STEP" "$1" >&2
  printf '[%s] fix: %s\n' "$PHASE" "$2" >&2
  exit 1
}

# The runner (`timeout MINUTES bash -s`) stops a phase at its bound with TERM to the whole
# process group: say so, naming the step, whichever of the two traps runs first.
PHASE_DEADLINE=$(( SECONDS + ${PHASE_MINUTES:-0} * 60 ))
past_bound() { (( ${PHASE_MINUTES:-0} > 0 && SECONDS >= PHASE_DEADLINE - 1 )); }
# The trap can run inside a command whose stderr is redirected (hf's errors file): write to the
# phase's own stderr, kept on its own descriptor.
exec {PHASE_STDERR}>&2
stopped_at_bound() {
  trap - ERR TERM
  printf '[%s] FAILED at step %s: the phase ran past its bound of %s minutes and was stopped\n' \
    "$PHASE" "$STEP" "$PHASE_MINUTES" >&"$PHASE_STDERR"
  printf '[%s] fix: the lines above show what it was waiting on; pulumi up again resumes here (the phases are idempotent)\n' "$PHASE" >&"$PHASE_STDERR"
  exit 124
}
trap stopped_at_bound TERM

on_error() {
  local code=$1 command=$2
  past_bound && stopped_at_bound
  trap - ERR
  printf '[%s] FAILED at step %s: "%s" exited %s\n' "$PHASE" "$STEP" "$command" "$code" >&2
  printf '[%s] fix: read the lines above; the phases are idempotent, so pulumi up again resumes here\n' "$PHASE" >&2
  exit "$code"
}
trap 'on_error $? "$BASH_COMMAND"' ERR

boot_id() { cat /proc/sys/kernel/random/boot_id; }

# cache_note: where a phase found its work already done, for its one "already" line: on the
# cache Volume an earlier Droplet filled (the cache phase's record), or on this Droplet.
cache_note() {
  local state='' created=''
  if [[ -f $STATE_DIR/cache.state ]]; then read -r state created < "$STATE_DIR/cache.state" || true; fi
  if [[ $state == warm ]]; then
    printf 'found on the cache Volume (made %s)' "$created"
  else
    printf 'found on this Droplet'
  fi
}

# finish [extra JSON members]: the phase's result, the last line of stdout. `run` makes every
# result unique, so a phase that ran again always changes what the next phases depend on.
finish() {
  local now seconds extra=${1:-}
  now=$(date +%s%N)
  seconds=$(( (now - PHASE_STARTED) / 1000000 ))
  # started_at/ended_at (epoch seconds): nemodrop/timeline.py draws the bootstrap from them.
  printf '{"phase":"%s","changed":%s,"seconds":%d.%03d,"started_at":%d.%03d,"ended_at":%d.%03d,"boot_id":"%s","run":"%s"%s}\n' \
    "$PHASE" "$CHANGED" $((seconds / 1000)) $((seconds % 1000)) \
    $((PHASE_STARTED / 1000000000)) $((PHASE_STARTED / 1000000 % 1000)) \
    $((now / 1000000000)) $((now / 1000000 % 1000)) "$(boot_id)" "$now" "${extra:+,$extra}"
  exit 0
}

# retry ATTEMPTS COMMAND...: run COMMAND until it succeeds, waiting 2, 4, 8... seconds between
# tries (NEMO_RETRY_DELAY scales the first wait).
retry() {
  local attempts=$1 try=1 delay=${NEMO_RETRY_DELAY:-2} what
  shift
  what=$1
  [[ $what == timeout ]] && what=$3  # timeout SECONDS COMMAND...
  until "$@"; do
    if (( try >= attempts )); then
      log "gave up after ${attempts} attempts: ${what}"
      return 1
    fi
    log "attempt ${try}/${attempts} failed: ${what}; retrying in ${delay}s"
    sleep "$delay"
    try=$((try + 1))
    delay=$((delay * 2))
  done
}

# download URL DEST SHA256: fetch with retries and bounded time, then verify the checksum
# (an empty SHA256 trusts the HTTPS server alone, and says so).
download() {
  local url=$1 dest=$2 sha=$3 got
  mkdir -p "$(dirname "$dest")"
  if [[ -n $sha && -f $dest ]] && [[ $(sha256sum "$dest" | cut -d' ' -f1) == "$sha" ]]; then
    log "already downloaded: $dest"
    return 0
  fi
  retry 4 curl --fail --silent --show-error --location --connect-timeout 20 --max-time 1800 \
    --output "$dest.part" "$url" \
    || fail "downloading $url failed 4 times" \
         "check the Droplet's outbound network (firewall egress, DNS) and that the URL exists"
  got=$(sha256sum "$dest.part" | cut -d' ' -f1)
  if [[ -z $sha ]]; then
    log "no checksum pinned for $url (sha256 ${got}); trusting its HTTPS server"
  elif [[ $got != "$sha" ]]; then
    rm -f "$dest.part"
    fail "checksum mismatch for $url: got $got, expected $sha" \
         "the file changed upstream or was corrupted; pin the release whose checksum you trust"
  fi
  mv "$dest.part" "$dest"
}

# install_file PATH MODE: write stdin to PATH if its content differs; say whether it changed.
install_file() {
  local path=$1 mode=$2 tmp
  tmp=$(mktemp "${path}.XXXXXX")
  cat > "$tmp"
  chmod "$mode" "$tmp"
  if [[ -f $path ]] && cmp -s "$tmp" "$path" && [[ $(stat -c %a "$path") == "$mode" ]]; then
    rm -f "$tmp"
    return 1
  fi
  mv "$tmp" "$path"
  return 0
}

# install_tree DIR: stdin, a tree as components/host/phase_settings.py shipped_tree sends one
# (per file a line `file PATH LINES`, then its LINES lines), as the root-owned folder DIR: files
# 644, folders 755. Built whole beside DIR and compared with it; only when a file's content or
# mode differs, or DIR holds a file the tree no longer has, it takes DIR's place (two renames: a
# cut between them leaves no DIR, which the next run installs, never a mix of two trees). Says
# whether it changed.
install_tree() {
  local dir=$1 tmp header path count
  local -a lines
  rm -rf "${dir}".new.* "${dir}.old"  # a run cut before it put its tree in place
  mkdir -p "$(dirname "$dir")"
  tmp=$(mktemp -d "${dir}.new.XXXXXX")
  mapfile -t lines
  local i=0 n=${#lines[@]}
  while (( i < n )); do
    header=${lines[i]}
    read -r _ path count <<<"$header"
    if [[ $header != "file $path $count" || ! $count =~ ^[0-9]+$ \
          || ! $path =~ ^[A-Za-z0-9_][A-Za-z0-9_./-]*$ || /$path/ == */../* ]] \
       || (( i + 1 + count > n )); then
      rm -rf "$tmp"
      fail "install_tree ${dir}: line $((i + 1)) is not a file's header (file PATH LINES)" \
           "a bug in the program's shipped_tree: report it"
    fi
    mkdir -p "$(dirname "$tmp/$path")"
    if (( count > 0 )); then
      printf '%s\n' "${lines[@]:i+1:count}" > "$tmp/$path"
    else
      : > "$tmp/$path"
    fi
    (( i += 1 + count ))
  done
  find "$tmp" -type d -exec chmod 755 {} +
  find "$tmp" -type f -exec chmod 644 {} +
  # Python's byte code (a run of the package as root writes it) is not the tree's.
  if [[ -d $dir ]] && diff -r -q -x __pycache__ "$tmp" "$dir" >/dev/null \
     && [[ $(cd "$tmp" && find . -path '*/__pycache__' -prune -o -printf '%p %m\n' | sort) \
           == $(cd "$dir" && find . -path '*/__pycache__' -prune -o -printf '%p %m\n' | sort) ]]; then
    rm -rf "$tmp"
    return 1
  fi
  if [[ -e $dir ]]; then mv -T "$dir" "${dir}.old"; fi
  mv -T "$tmp" "$dir"
  rm -rf "${dir}.old"
  return 0
}

# install_unit NAME: stdin as /etc/systemd/system/NAME (install_file), systemd told when it
# changed; says whether it changed.
install_unit() {
  install_file "/etc/systemd/system/$1" 644 || return 1
  systemctl daemon-reload >&2
}

# start_unit NAME RESTART: NAME enabled at boot, and (re)started when RESTART is true (what it
# runs changed) or it is not running; `changed` for either.
start_unit() {
  if ! systemctl is-enabled --quiet "$1"; then
    systemctl enable "$1" >&2
    changed
  fi
  if [[ $2 == true ]] || ! systemctl is-active --quiet "$1"; then
    systemctl restart "$1" >&2
    changed
  fi
}

# install_secret PATH: install_file for secrets: stdin to PATH, mode 600, in a folder only root
# may enter; says whether it changed.
install_secret() {
  mkdir -p "$(dirname "$1")"
  chmod 700 "$(dirname "$1")"
  install_file "$1" 600
}

# bounded SECONDS COMMAND...: COMMAND, stopped after SECONDS. A plain `timeout` moves its
# command into a process group of its own, where the runner's bound (TERM to the phase's group)
# never reaches it: the phase would hang past its bound and the runner's KILL would orphan it.
# --foreground keeps it in the phase's group.
bounded() {
  local seconds=$1
  shift
  timeout --foreground --kill-after=30 "$seconds" "$@"
}

# apt_get ARGS...: every apt-get of the phases. Waits for the dpkg lock (unattended-upgrades
# starts from a timer at any time after boot) instead of failing on it, keeps the config files
# already there, never prompts, and is bounded in time (APT_SECONDS).
# Phases run side by side (the driver beside the vllm env): our own apt calls take turns on one
# flock, since two `apt-get update`s collide on the lists lock, which DPkg::Lock::Timeout does
# not wait for.
APT_LOCK_WAIT_SECONDS=900
apt_get() {
  mkdir -p "$STATE_DIR"
  bounded "${APT_SECONDS:-1800}" flock --wait "$APT_LOCK_WAIT_SECONDS" "$STATE_DIR/apt.lock" \
    apt-get -q -y -o "DPkg::Lock::Timeout=${APT_LOCK_WAIT_SECONDS}" \
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "$@"
}

# apt_install PACKAGES...: update the lists, then install (no recommends), each retried.
apt_install() {
  retry 3 apt_get update >&2 \
    || fail "apt-get update failed 3 times" "check the Droplet's outbound network and DNS, then pulumi up again"
  retry 3 apt_get install --no-install-recommends "$@" >&2
}

request_reboot() {
  mkdir -p "$REBOOT_DIR"
  printf '%s\n' "$1" > "$REBOOT_DIR/$PHASE"
  log "asked for a reboot: $1"
}

# drain: a replica leaves its balancer's pool before it goes down (a vLLM restart, a reboot).
# Its gateway answers /health with 503 while NEMO_DRAIN_FILE exists (and, behind the Caddy
# balancer, new API requests with a 503 the balancer retries elsewhere); the balancer stops
# sending it new requests within NEMO_DRAIN_NOTICE_SECONDS; then this waits until vLLM has no
# request running or waiting (NEMO_METRICS_URL), at most NEMO_DRAIN_SECONDS, and no longer than
# NEMO_DRAIN_STALL_SECONDS without a token generated or prefilled. The ready phase (or the
# reboot, the file being under /run) ends the drain; a phase stopped before its restart (its
# bound, an error, its session gone) ends it on the way out.
drain() {
  drain_begin
  drain_wait
  # From here the caller restarts or reboots: the drain lasts until ready (or the reboot).
  trap - EXIT HUP PIPE
}

drain_begin() {
  install -d -m 755 "$(dirname "$NEMO_DRAIN_FILE")"
  # Nothing has gone down yet: stopped now, the replica serves on, so it rejoins at once rather
  # than answering 503 until a later run's ready phase. A lost session (HUP, or PIPE on the next
  # log line) exits through the same trap.
  trap drain_abandoned EXIT
  trap 'exit 129' HUP
  trap 'exit 141' PIPE
  : > "$NEMO_DRAIN_FILE"
  chmod 644 "$NEMO_DRAIN_FILE"
  changed
  log "/health answers 503; waiting ${NEMO_DRAIN_NOTICE_SECONDS}s for the balancer to see it"
  sleep "$NEMO_DRAIN_NOTICE_SECONDS"
}

drain_abandoned() {
  rm -f "$NEMO_DRAIN_FILE"
  printf '[%s] stopped while draining, before anything restarted: the drain ends (/health answers 200 again)\n' \
    "$PHASE" >&"$PHASE_STDERR" || true
}

# vllm_load: "REQUESTS TOKENS" from vLLM's /metrics: requests running or waiting, and tokens
# generated plus prefilled so far ("-" when it counts none); nothing when unreadable.
vllm_load() {
  curl --silent --fail --max-time "$METRICS_READ_SECONDS" "$NEMO_METRICS_URL" 2>/dev/null | awk '
    /^vllm:num_requests_(running|waiting)[{ ]/ { n += $NF; seen = 1 }
    /^vllm:(generation|prompt)_tokens_total[{ ]/ { t += $NF; counted = 1 }
    END { if (seen) printf "%d %s\n", n, (counted ? sprintf("%.0f", t) : "-") }' || true
}
# As pool.py's METRICS_READ_SECONDS and DRAIN_POLL_SECONDS (the drain's bound counts them).
METRICS_READ_SECONDS=5
DRAIN_POLL_SECONDS=2

drain_wait() {
  local load n tokens last='' moved=$SECONDS deadline=$((SECONDS + NEMO_DRAIN_SECONDS))
  while true; do
    load=$(vllm_load)
    if [[ -z $load ]]; then
      log "vLLM's metrics are unreadable (not running?): going on now"
      return 0
    fi
    read -r n tokens <<<"$load"
    if (( n == 0 )); then
      log "no request in flight"
      return 0
    fi
    [[ $tokens == "$last" ]] || { last=$tokens; moved=$SECONDS; }
    if [[ $tokens != - ]] && (( SECONDS - moved >= NEMO_DRAIN_STALL_SECONDS )); then
      log "${n} request(s) in flight by vLLM's gauges, but no token generated or prefilled for ${NEMO_DRAIN_STALL_SECONDS}s: stuck gauges (vllm-project/vllm#22545), going on"
      return 0
    fi
    if (( SECONDS >= deadline )); then
      log "${n} request(s) still in flight after ${NEMO_DRAIN_SECONDS}s: going on (they are cut)"
      return 0
    fi
    sleep "$DRAIN_POLL_SECONDS"
  done
}

# driver_status: "ok VERSION", "old VERSION" or "none MESSAGE", for NEMO_MIN_DRIVER_BRANCH.
driver_status() {
  local out version
  if ! out=$(bounded 60 nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>&1); then
    printf 'none %s\n' "$(printf '%s' "$out" | head -n 1)"
    return 0
  fi
  version=$(printf '%s\n' "$out" | head -n 1 | tr -d ' ')
  if (( ${version%%.*} >= NEMO_MIN_DRIVER_BRANCH )); then
    printf 'ok %s\n' "$version"
  else
    printf 'old %s\n' "$version"
  fi
}

mkdir -p "$STATE_DIR"
log "started on $(hostname) (boot $(boot_id))"
