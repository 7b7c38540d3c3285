# shellcheck shell=bash
# reboot: reboot once if a phase asked for it (or Ubuntu's /var/run/reboot-required exists),
# detached so that this command exits 0; reboot-wait then waits for SSH and a new boot id.
# A replica behind a balancer (NEMO_DRAIN_FILE set) drains first (lib.sh drain).
# Settings: NEMO_REBOOT_DELAY NEMO_DRAIN_FILE NEMO_DRAIN_NOTICE_SECONDS NEMO_DRAIN_SECONDS
#           NEMO_DRAIN_STALL_SECONDS NEMO_METRICS_URL

step reasons "did any phase ask for a reboot?"
reasons=()
if [[ -d $REBOOT_DIR ]]; then
  for f in "$REBOOT_DIR"/*; do
    [[ -f $f ]] && reasons+=("$(basename "$f"): $(<"$f")")
  done
fi
[[ -f /var/run/reboot-required ]] && reasons+=("ubuntu: /var/run/reboot-required")
if (( ${#reasons[@]} == 0 )); then
  log "no reboot needed"
  finish '"rebooting":false'
fi
for r in "${reasons[@]}"; do log "reboot reason: ${r}"; done

if [[ -n $NEMO_DRAIN_FILE ]]; then
  step drain "leave the balancer's pool before the reboot"
  drain
fi

step schedule "reboot in ${NEMO_REBOOT_DELAY}s, detached from this session"
systemd-run --quiet --unit=nemotron-reboot --on-active="${NEMO_REBOOT_DELAY}" systemctl reboot >&2
# Refuse new SSH sessions from now on, so the next phase's dial waits for the new boot instead
# of landing on this one while it goes down; this session stays open.
systemctl stop ssh.socket ssh.service >&2 2>/dev/null || systemctl stop ssh >&2 2>/dev/null || true
changed
finish '"rebooting":true'
