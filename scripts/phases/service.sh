# shellcheck shell=bash
# service: the `vllm` system user, its root-only EnvironmentFile and the systemd unit the
# program rendered (vLLM on 127.0.0.1 only; Restart=on-failure; LimitNOFILE; no metadata
# service). Restarts the service whenever what it runs with changed: its unit, its env file, the
# vLLM installed under it, or the weights.
# A replica behind a balancer (NEMO_DRAIN_FILE set) drains before it restarts a running vLLM:
# its gateway's /health answers 503 while the file exists, the balancer stops sending it new
# requests within NEMO_DRAIN_NOTICE_SECONDS, and the restart waits until vLLM has no request
# running or waiting (its /metrics), at most NEMO_DRAIN_SECONDS. The ready phase ends the drain.
# A new vLLM is a new env (the vllm phase installs it beside the running one): the unit names
# it, so the unit changes and the restart switches to it; once it has answered (the ready
# phase), the envs before it go (NEMO_RUNS_ENV_FILE records which env it was started from).
# Settings: NEMO_VLLM_USER NEMO_HF_HOME NEMO_ENV_FILE NEMO_UNIT NEMO_UNIT_TEXT NEMO_ENV_TEXT
#           NEMO_RUNS_FROM NEMO_DRAIN_FILE NEMO_DRAIN_NOTICE_SECONDS NEMO_DRAIN_SECONDS
#           NEMO_DRAIN_STALL_SECONDS NEMO_METRICS_URL NEMO_VLLM_ENV NEMO_VLLM_MARKER
#           NEMO_RUNS_ENV_FILE

stamp_file=$STATE_DIR/${NEMO_UNIT%.service}.runs-from
baseline_file=$STATE_DIR/${NEMO_UNIT%.service}.restarts
# What vLLM keys its torch.compile and kernel caches on, as far as this phase sees it: the vLLM
# (its env: version and lock) and how the unit runs it (its command line and environment).
# vLLM hashes its whole config into the cache's folder name (vllm/config/vllm.py compute_hash),
# so a change here means a start that compiles again: said before the restart, in pulumi up's
# output (pulumi-command logs a command's stderr by default: remote/command.go `logging`).
compile_key_file=$STATE_DIR/${NEMO_UNIT%.service}.compile-key
# The env file counts too (its VLLM_* settings), all but the API key, which compiles nothing.
compile_key=$(printf '%s\n%s\n%s\n' "$NEMO_VLLM_ENV" "$(grep -E '^(ExecStart|Environment)=' <<<"$NEMO_UNIT_TEXT")" \
  "$(grep -v '^VLLM_API_KEY=' <<<"$NEMO_ENV_TEXT" || true)" | sha256sum | cut -c1-16)

# compile_note: before a restart, whether vLLM's compile cache can hit on this start.
compile_note() {
  local last
  last=$(cat "$compile_key_file" 2>/dev/null || true)
  if [[ -z $last ]]; then
    log "compile cache: no start recorded on this Droplet; timeline.py --journal says whether it hit"
  elif [[ $last == "$compile_key" ]]; then
    log "compile cache: same vLLM and serve flags as the last start: its graphs and kernels come from the cache"
  else
    log "compile cache: the vLLM or its serve flags changed since the last start: torch.compile and the kernels build again on this start (tens of seconds), then the cache holds them"
  fi
}

step user "system user ${NEMO_VLLM_USER}"
if id -u "$NEMO_VLLM_USER" >/dev/null 2>&1; then
  log "user ${NEMO_VLLM_USER} exists"
else
  useradd --system --home-dir "/var/lib/${NEMO_VLLM_USER}" --create-home \
    --shell /usr/sbin/nologin "$NEMO_VLLM_USER"
  changed
fi
# The service reads the weights and writes its compile caches under its home.
chown -R "$NEMO_VLLM_USER:" "$NEMO_HF_HOME" "/var/lib/${NEMO_VLLM_USER}"

step old-guard "the iptables metadata guard of earlier versions is replaced by the units' own"
# It ran before network-pre.target (holding networking back) and only after the gateway phase;
# the units now carry IPAddressDeny= themselves.
old_guard=/etc/systemd/system/nemotron-metadata-guard.service
if [[ -f $old_guard ]]; then
  systemctl disable nemotron-metadata-guard.service >&2 2>/dev/null || true
  rm -f "$old_guard"
  systemctl daemon-reload >&2
  changed
fi

step vllm-env "the vLLM the unit runs is complete: ${NEMO_VLLM_ENV}"
# Its marker is written last (the vllm phase): never switch the service to a cut install.
[[ -f $NEMO_VLLM_MARKER ]] \
  || fail "${NEMO_VLLM_ENV} is missing or incomplete (no ${NEMO_VLLM_MARKER##*/})" \
          "pulumi up again: the vllm phase installs it before this phase"

restart=false
step env-file "root-only ${NEMO_ENV_FILE}"
if printf '%s\n' "$NEMO_ENV_TEXT" | install_secret "$NEMO_ENV_FILE"; then
  changed
  restart=true
fi

step unit "/etc/systemd/system/${NEMO_UNIT}"
if printf '%s\n' "$NEMO_UNIT_TEXT" | install_unit "$NEMO_UNIT"; then
  changed
  restart=true
fi

step runs-from "the unit, its env file, the vLLM and the weights the service runs"
# What the service was last started from, recorded at each start: a run stopped between
# installing a new unit (or env file) and the restart still restarts on the next run, which finds
# both files already in place. The files count by their sha256 (never logged: the env file
# holds the key). A record of earlier versions has no file line: what it holds is compared.
read -ra sources <<<"$NEMO_RUNS_FROM"
runs_from=$(for f in "${sources[@]}"; do printf '%s: %s\n' "$f" "$(cat "$f" 2>/dev/null || echo missing)"; done)
files=$(sha256sum "/etc/systemd/system/${NEMO_UNIT}" "$NEMO_ENV_FILE" | cut -d' ' -f1 | tr '\n' ' ')
started_from="${runs_from}"$'\n'"files: ${files}"
recorded=$(cat "$stamp_file" 2>/dev/null || true)
if [[ $recorded != *$'\n'"files: "* && $recorded == "$runs_from" && $restart == false ]]; then
  printf '%s\n' "$started_from" > "$stamp_file"
  recorded=$started_from
fi
if [[ $recorded != "$started_from" ]]; then
  if [[ $recorded == "${runs_from}"* ]]; then
    log "the unit or its env file changed since the service started"
  else
    log "what the service runs changed: ${runs_from//$'\n'/; }"
  fi
  restart=true
fi

if [[ -n $NEMO_DRAIN_FILE ]] && [[ $restart == true ]] && systemctl is-active --quiet "$NEMO_UNIT"; then
  step drain "leave the balancer's pool before the restart"
  drain
fi

step start "enable and (re)start ${NEMO_UNIT}"
if ! systemctl is-enabled --quiet "$NEMO_UNIT"; then
  systemctl enable "$NEMO_UNIT" >&2
  changed
fi
if [[ $restart == true ]] || ! systemctl is-active --quiet "$NEMO_UNIT"; then
  compile_note
  systemctl restart "$NEMO_UNIT" >&2
  printf '%s\n' "$started_from" > "$stamp_file"
  printf '%s\n' "$NEMO_VLLM_ENV" > "$NEMO_RUNS_ENV_FILE"
  printf '%s\n' "$compile_key" > "$compile_key_file"
  changed
  log "started ${NEMO_UNIT}; the ready phase waits for the model to load"
else
  log "${NEMO_UNIT} is running with this configuration"
fi
# The ready phase counts crashes from here: systemd restarts a failing unit without end
# (Restart=on-failure, RestartSec=10 never reaches the start limit), never showing it failed.
systemctl show -p NRestarts --value "$NEMO_UNIT" > "$baseline_file"

# The envs before this one stay until it has answered (the ready phase removes them): should
# the new vLLM not start, the one it replaced is still there to go back to.
finish
