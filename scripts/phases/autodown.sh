# shellcheck shell=bash
# autodown: a systemd timer that runs the autodown package every minute, deleting this Droplet
# when it is idle too long or up too long (see scripts/phases/autodown/). Off: removes the timer
# and the folder if an earlier run installed them. The token lives in a root-only
# EnvironmentFile.
# Settings: NEMO_AUTODOWN_MODE (off|delete|dry-run) NEMO_AUTODOWN_ENV_TEXT NEMO_AUTODOWN_TREE
# NEMO_AUTODOWN_DIR NEMO_AUTODOWN_OLD_SCRIPT NEMO_AUTODOWN_ENV_FILE NEMO_AUTODOWN_SERVICE_TEXT
# NEMO_AUTODOWN_TIMER_TEXT

dir=$NEMO_AUTODOWN_DIR
old_script=$NEMO_AUTODOWN_OLD_SCRIPT
env_file=$NEMO_AUTODOWN_ENV_FILE
service=/etc/systemd/system/nemotron-autodown.service
timer=/etc/systemd/system/nemotron-autodown.timer

if [[ $NEMO_AUTODOWN_MODE == off ]]; then
  step remove "autodown is off: no timer"
  if [[ -f $timer ]]; then
    systemctl disable --now nemotron-autodown.timer >&2 || true
    rm -f "$timer" "$service"
    systemctl daemon-reload >&2
    changed
  fi
  # Whether or not a timer was written: a run cut before it may have left the rest.
  for file in "$env_file" "$old_script"; do
    if [[ -e $file ]]; then rm -f "$file"; changed; fi
  done
  if [[ -e $dir ]]; then rm -rf "$dir"; changed; fi
  if [[ $CHANGED == true ]]; then log "removed the autodown timer"; else log "no autodown timer installed"; fi
  finish '"autodown":"off"'
fi

reload=false
step package "${dir}: the rule's package and the clients it uses (replaced only when a file changed)"
if printf '%s\n' "$NEMO_AUTODOWN_TREE" | install_tree "$dir"; then changed; fi

step env-file "root-only ${env_file}"
if printf '%s\n' "$NEMO_AUTODOWN_ENV_TEXT" | install_secret "$env_file"; then changed; fi

# A oneshot that the timer starts each minute: a new package or env file is read by the next
# run, so nothing restarts; systemd reloads only when a unit file changed.
step units "nemotron-autodown.service and .timer (every minute)"
if printf '%s\n' "$NEMO_AUTODOWN_SERVICE_TEXT" | install_file "$service" 644; then
  reload=true
  changed
fi
if printf '%s\n' "$NEMO_AUTODOWN_TIMER_TEXT" | install_file "$timer" 644; then
  reload=true
  changed
fi
[[ $reload == true ]] && systemctl daemon-reload >&2
# The rule was one file before it was a package: a host upgraded from it keeps none, once the
# unit runs the package (a minute's run between the two would find no file).
if [[ -e $old_script ]]; then
  rm -f "$old_script"
  log "removed ${old_script} (the single-file rule of earlier releases)"
  changed
fi

step enable "start the timer"
if ! systemctl is-enabled --quiet nemotron-autodown.timer; then
  systemctl enable nemotron-autodown.timer >&2
  changed
fi
if ! systemctl is-active --quiet nemotron-autodown.timer; then
  systemctl start nemotron-autodown.timer >&2
  changed
fi
log "autodown is on (${NEMO_AUTODOWN_MODE})"
finish "\"autodown\":\"${NEMO_AUTODOWN_MODE}\""
