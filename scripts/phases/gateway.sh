# shellcheck shell=bash
# gateway: Caddy in front of vLLM (which stays on 127.0.0.1). Every /v1 route needs the key,
# GET /health does not, everything else is refused; HTTPS from a public ACME CA. The key reaches
# Caddy from a root-only EnvironmentFile; Caddy's unit may not reach the metadata service,
# which serves the user data (with the SSH host key).
# Settings: NEMO_HOST NEMO_CADDYFILE NEMO_CADDY_UNIT_TEXT NEMO_GATEWAY_ENV_FILE NEMO_GATEWAY_ENV_TEXT
#           NEMO_CADDY_VERSION NEMO_CADDY_URL NEMO_CADDY_SHA256 NEMO_CADDY_BIN NEMO_CADDY_USER
#           NEMO_CADDY_HOME NEMO_CADDY_RELOAD NEMO_UPSTREAMS_DIR
# On the balancer (NEMO_CADDY_RELOAD) a running Caddy takes a new Caddyfile by graceful reload,
# never a restart: the streams through it go on.

restart=false
unit=/etc/systemd/system/caddy.service
caddy_dir=$(dirname "$NEMO_CADDY_BIN")

step caddy "Caddy ${NEMO_CADDY_VERSION}: the release's binary, verified by its sha256"
have=""
[[ -x $NEMO_CADDY_BIN ]] && have=$(sha256sum "$NEMO_CADDY_BIN" | cut -d' ' -f1)
if [[ $have == "$NEMO_CADDY_SHA256" ]]; then
  log "installed: ${NEMO_CADDY_BIN} ($("$NEMO_CADDY_BIN" version 2>/dev/null | cut -d' ' -f1))"
else
  staging="${caddy_dir}.new"
  rm -rf "$staging"
  mkdir -p "$staging"
  retry 4 curl --fail --silent --show-error --location --connect-timeout 20 --max-time 600 \
      --output "$staging/caddy.tar.gz" "$NEMO_CADDY_URL" \
    || fail "downloading ${NEMO_CADDY_URL} failed 4 times" \
            "check the Droplet's outbound network (firewall egress, DNS) and pulumi up again"
  tar -xzf "$staging/caddy.tar.gz" -C "$staging" caddy \
    || fail "the Caddy release archive has no caddy binary or is damaged" "pulumi up again downloads it afresh"
  got=$(sha256sum "$staging/caddy" | cut -d' ' -f1)
  if [[ $got != "$NEMO_CADDY_SHA256" ]]; then
    rm -rf "$staging"
    fail "the Caddy ${NEMO_CADDY_VERSION} binary from ${NEMO_CADDY_URL} has sha256 ${got}, expected ${NEMO_CADDY_SHA256}" \
         "do not use it: the release changed upstream or the download was altered; report it"
  fi
  rm -f "$staging/caddy.tar.gz"
  chmod 755 "$staging/caddy"
  rm -rf "$caddy_dir"
  mv "$staging" "$caddy_dir"
  log "installed Caddy ${NEMO_CADDY_VERSION} in ${caddy_dir}"
  changed
  restart=true
fi

step user "system user ${NEMO_CADDY_USER} (home ${NEMO_CADDY_HOME}: its certificates and ACME account)"
if ! id -u "$NEMO_CADDY_USER" >/dev/null 2>&1; then
  useradd --system --user-group --home-dir "$NEMO_CADDY_HOME" --shell /usr/sbin/nologin "$NEMO_CADDY_USER"
  changed
fi
mkdir -p "$NEMO_CADDY_HOME"
chown "$NEMO_CADDY_USER:$NEMO_CADDY_USER" "$NEMO_CADDY_HOME"
chmod 750 "$NEMO_CADDY_HOME"

step env-file "root-only ${NEMO_GATEWAY_ENV_FILE} with the key"
if printf '%s\n' "$NEMO_GATEWAY_ENV_TEXT" | install_secret "$NEMO_GATEWAY_ENV_FILE"; then
  changed
  restart=true
fi

step unit "caddy.service: the key from that file, never printed; no metadata service"
reload=false
if printf '%s\n' "$NEMO_CADDY_UNIT_TEXT" | install_file "$unit" 644; then
  reload=true
fi
# Earlier versions ran Ubuntu's caddy package with a drop-in; the unit above replaces both.
if [[ -e /etc/systemd/system/caddy.service.d/nemotron.conf ]]; then
  rm -f /etc/systemd/system/caddy.service.d/nemotron.conf
  rmdir --ignore-fail-on-non-empty /etc/systemd/system/caddy.service.d
  log "removed the drop-in of earlier versions"
  reload=true
fi
if [[ $reload == true ]]; then
  systemctl daemon-reload >&2
  changed
  restart=true
fi

step config "/etc/caddy/Caddyfile for ${NEMO_HOST}"
mkdir -p /etc/caddy
[[ -z $NEMO_UPSTREAMS_DIR ]] || mkdir -p "$NEMO_UPSTREAMS_DIR"
reload_only=false
staged=$(mktemp /etc/caddy/Caddyfile.XXXXXX)
printf '%s\n' "$NEMO_CADDYFILE" > "$staged"
if ! errors=$(env NEMO_API_KEY=validation-only "$NEMO_CADDY_BIN" validate --config "$staged" --adapter caddyfile 2>&1); then
  rm -f "$staged"
  printf '%s\n' "$errors" | tail -n 5 | sed "s/^/[$PHASE] caddy: /" >&2
  fail "the rendered Caddyfile does not validate" "report it: the gateway configuration comes from the program"
fi
if cmp -s "$staged" /etc/caddy/Caddyfile; then
  rm -f "$staged"
else
  chmod 644 "$staged"
  mv "$staged" /etc/caddy/Caddyfile
  changed
  if [[ $NEMO_CADDY_RELOAD == true && $restart == false ]] && systemctl is-active --quiet caddy.service; then
    reload_only=true
  else
    restart=true
  fi
fi

step start "enable and (re)start caddy"
systemctl enable caddy.service >&2 2>/dev/null || true
if [[ $restart == true ]] || ! systemctl is-active --quiet caddy.service; then
  systemctl restart caddy.service >&2
  changed
elif [[ $reload_only == true ]]; then
  systemctl reload caddy.service >&2
  log "reloaded gracefully: requests in flight finish on the old configuration"
fi
for _ in $(seq 1 30); do
  systemctl is-active --quiet caddy.service && break
  sleep 1
done
systemctl is-active --quiet caddy.service \
  || fail "caddy.service is not running" "journalctl -u caddy on the Droplet shows why"
log "gateway for ${NEMO_HOST} is running"
finish "\"host\":\"${NEMO_HOST}\""
