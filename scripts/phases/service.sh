# shellcheck shell=bash
# service: the `vllm` system user, its root-only EnvironmentFile and the systemd unit the
# program rendered (vLLM on 127.0.0.1 only; Restart=on-failure; LimitNOFILE). Restarts the
# service only when something it runs with changed.
# Settings: NEMO_VLLM_USER NEMO_HF_HOME NEMO_ENV_FILE NEMO_UNIT NEMO_UNIT_TEXT NEMO_ENV_TEXT

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

restart=false
step env-file "root-only ${NEMO_ENV_FILE}"
if printf '%s\n' "$NEMO_ENV_TEXT" | install_secret "$NEMO_ENV_FILE"; then
  changed
  restart=true
fi

step unit "/etc/systemd/system/${NEMO_UNIT}"
if printf '%s\n' "$NEMO_UNIT_TEXT" | install_file "/etc/systemd/system/${NEMO_UNIT}" 644; then
  systemctl daemon-reload >&2
  changed
  restart=true
fi

step start "enable and (re)start ${NEMO_UNIT}"
if ! systemctl is-enabled --quiet "$NEMO_UNIT"; then
  systemctl enable "$NEMO_UNIT" >&2
  changed
fi
if [[ $restart == true ]] || ! systemctl is-active --quiet "$NEMO_UNIT"; then
  systemctl restart "$NEMO_UNIT" >&2
  changed
  log "started ${NEMO_UNIT}; the ready phase waits for the model to load"
else
  log "${NEMO_UNIT} is running with this configuration"
fi
finish
