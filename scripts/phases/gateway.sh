# shellcheck shell=bash
# gateway: Caddy in front of vLLM (which stays on 127.0.0.1). Every /v1 route needs the key,
# GET /health does not, everything else is refused; HTTPS from a public ACME CA. The key reaches
# Caddy from a root-only EnvironmentFile; Caddy's unit may not reach the metadata service,
# which serves the user data (with the SSH host key).
# Settings: NEMO_HOST NEMO_CADDYFILE NEMO_CADDY_DROPIN NEMO_GATEWAY_ENV_FILE NEMO_GATEWAY_ENV_TEXT
#           NEMO_CADDY_APT_KEY_URL NEMO_CADDY_APT_REPO

restart=false

step caddy "the Caddy package"
if command -v caddy >/dev/null; then
  log "installed: $(caddy version 2>/dev/null | head -n 1)"
else
  retry 3 apt_get update >&2 || fail "apt-get update failed 3 times" "check outbound network and DNS"
  if [[ $(apt-cache policy caddy 2>/dev/null | awk '/Candidate:/ {print $2}') =~ ^(|\(none\))$ ]]; then
    # Not in this release's archive (Ubuntu 22.04): Caddy's own apt repository, trusted by HTTPS.
    download "$NEMO_CADDY_APT_KEY_URL" /var/cache/nemotron/caddy.asc ""
    gpg --batch --yes --dearmor -o /usr/share/keyrings/caddy-stable-archive-keyring.gpg /var/cache/nemotron/caddy.asc
    echo "deb [signed-by=/usr/share/keyrings/caddy-stable-archive-keyring.gpg] ${NEMO_CADDY_APT_REPO} any-version main" \
      > /etc/apt/sources.list.d/caddy-stable.list
  fi
  apt_install caddy \
    || fail "could not install caddy" "check apt on the Droplet (apt-cache policy caddy)"
  changed
fi

step env-file "root-only ${NEMO_GATEWAY_ENV_FILE} with the key"
if printf '%s\n' "$NEMO_GATEWAY_ENV_TEXT" | install_secret "$NEMO_GATEWAY_ENV_FILE"; then
  changed
  restart=true
fi

step unit "caddy.service reads that file and does not print its environment"
mkdir -p /etc/systemd/system/caddy.service.d
if printf '%s\n' "$NEMO_CADDY_DROPIN" | install_file /etc/systemd/system/caddy.service.d/nemotron.conf 644; then
  systemctl daemon-reload >&2
  changed
  restart=true
fi

step config "/etc/caddy/Caddyfile for ${NEMO_HOST}"
mkdir -p /etc/caddy
staged=$(mktemp /etc/caddy/Caddyfile.XXXXXX)
printf '%s\n' "$NEMO_CADDYFILE" > "$staged"
if ! errors=$(env NEMO_API_KEY=validation-only caddy validate --config "$staged" --adapter caddyfile 2>&1); then
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
  restart=true
fi

step start "enable and (re)start caddy"
systemctl enable caddy.service >&2 2>/dev/null || true
if [[ $restart == true ]] || ! systemctl is-active --quiet caddy.service; then
  systemctl restart caddy.service >&2
  changed
fi
for _ in $(seq 1 30); do
  systemctl is-active --quiet caddy.service && break
  sleep 1
done
systemctl is-active --quiet caddy.service \
  || fail "caddy.service is not running" "journalctl -u caddy on the Droplet shows why"
log "gateway for ${NEMO_HOST} is running"
finish "\"host\":\"${NEMO_HOST}\""
