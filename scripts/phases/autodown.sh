# shellcheck shell=bash
# autodown: a systemd timer that runs autodown.py every minute, deleting this Droplet when it is
# idle too long or up too long (see autodown.py). Off: removes the timer if an earlier run
# installed it. The token lives in a root-only EnvironmentFile.
# Settings: NEMO_AUTODOWN_MODE (off|delete|dry-run) NEMO_AUTODOWN_ENV_TEXT NEMO_AUTODOWN_PY
# NEMO_AUTODOWN_SCRIPT NEMO_AUTODOWN_ENV_FILE NEMO_AUTODOWN_SERVICE_TEXT NEMO_AUTODOWN_TIMER_TEXT

lib=$NEMO_AUTODOWN_SCRIPT
env_file=$NEMO_AUTODOWN_ENV_FILE
service=/etc/systemd/system/nemotron-autodown.service
timer=/etc/systemd/system/nemotron-autodown.timer

if [[ $NEMO_AUTODOWN_MODE == off ]]; then
  step remove "autodown is off: no timer"
  if [[ -f $timer ]]; then
    systemctl disable --now nemotron-autodown.timer >&2 || true
    rm -f "$timer" "$service" "$env_file" "$lib"
    systemctl daemon-reload >&2
    changed
    log "removed the autodown timer"
  else
    log "no autodown timer installed"
  fi
  finish '"autodown":"off"'
fi

reload=false
step script "${lib}"
mkdir -p "$(dirname "$lib")"
if printf '%s\n' "$NEMO_AUTODOWN_PY" | install_file "$lib" 755; then changed; fi

step env-file "root-only ${env_file}"
if printf '%s\n' "$NEMO_AUTODOWN_ENV_TEXT" | install_secret "$env_file"; then changed; fi

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
