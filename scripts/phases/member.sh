# shellcheck shell=bash
# member (on the Caddy balancer): replica NEMO_REPLICA enters the pool, ready, by a file of its
# own in the upstreams folder and a graceful reload (requests in flight finish on the old
# configuration). Run with NEMO_ACTION=leave (the Command's delete, before the replica's
# Droplet is replaced or removed) it leaves: its file goes, Caddy reloads, and the phase waits
# until no request is in flight to it (the admin API's /reverse_proxy/upstreams), at most
# NEMO_LEAVE_SECONDS.
# Settings: NEMO_REPLICA NEMO_UPSTREAM NEMO_UPSTREAM_FILE NEMO_UPSTREAM_LINE NEMO_UPSTREAMS_DIR
#           NEMO_ADMIN_SOCKET NEMO_CADDY_UNIT NEMO_CADDY_BIN NEMO_LEAVE_SECONDS

action=${NEMO_ACTION:-join}
[[ $action == join || $action == leave ]] \
  || fail "NEMO_ACTION=${action}: accepted: join, leave" "report it: the program sets it"

# in_flight: requests in flight to this replica, per Caddy's admin API ("" when Caddy does not
# list it: no request holds it any more).
in_flight() {
  curl --silent --fail --max-time 5 --unix-socket "$NEMO_ADMIN_SOCKET" \
      http://localhost/reverse_proxy/upstreams 2>/dev/null \
    | python3 -c '
import json, sys
want = sys.argv[1]
for up in json.load(sys.stdin) or []:
    if up.get("address") == want:
        print(up.get("num_requests", 0))
' "$NEMO_UPSTREAM" 2>/dev/null || true
}

# reload_caddy: check the whole configuration, then reload it gracefully (a stopped Caddy is
# started instead: nothing is in flight through it).
reload_caddy() {
  if ! errors=$(env NEMO_API_KEY=validation-only "$NEMO_CADDY_BIN" validate --config /etc/caddy/Caddyfile --adapter caddyfile 2>&1); then
    printf '%s\n' "$errors" | tail -n 5 | sed "s/^/[$PHASE] caddy: /" >&2
    return 1
  fi
  if systemctl is-active --quiet "$NEMO_CADDY_UNIT"; then
    systemctl reload "$NEMO_CADDY_UNIT" >&2
  else
    log "${NEMO_CADDY_UNIT} was not running: starting it"
    systemctl restart "$NEMO_CADDY_UNIT" >&2
  fi
}

if [[ $action == join ]]; then
  step file "replica ${NEMO_REPLICA} at ${NEMO_UPSTREAM}: ${NEMO_UPSTREAM_FILE}"
  mkdir -p "$NEMO_UPSTREAMS_DIR"
  if [[ $(cat "$NEMO_UPSTREAM_FILE" 2>/dev/null) == "$NEMO_UPSTREAM_LINE" ]]; then
    log "already in the pool"
  else
    printf '%s\n' "$NEMO_UPSTREAM_LINE" > "${NEMO_UPSTREAM_FILE}.tmp"
    mv "${NEMO_UPSTREAM_FILE}.tmp" "$NEMO_UPSTREAM_FILE"
    changed
    step reload "graceful reload: new requests may go to replica ${NEMO_REPLICA}"
    if ! reload_caddy; then
      rm -f "$NEMO_UPSTREAM_FILE"
      fail "Caddy refused the configuration with replica ${NEMO_REPLICA}" \
           "the lines above say why; pulumi up again (the file was removed)"
    fi
  fi
  finish "\"upstream\":\"${NEMO_UPSTREAM}\""
fi

step file "replica ${NEMO_REPLICA} at ${NEMO_UPSTREAM} leaves the pool"
if [[ -e $NEMO_UPSTREAM_FILE ]]; then
  rm -f "$NEMO_UPSTREAM_FILE"
  changed
  step reload "graceful reload: no new request goes to ${NEMO_UPSTREAM}"
  if ! systemctl is-active --quiet "$NEMO_CADDY_UNIT"; then
    log "Caddy is not running: nothing is in flight"
  elif ! reload_caddy; then
    fail "Caddy refused the configuration without replica ${NEMO_REPLICA}" \
         "the lines above say why; pulumi up again"
  fi
else
  log "not in the pool"
fi

step drain "wait for the requests in flight to ${NEMO_UPSTREAM} (at most ${NEMO_LEAVE_SECONDS}s)"
deadline=$((SECONDS + NEMO_LEAVE_SECONDS))
while true; do
  n=$(in_flight)
  if [[ -z $n || $n == 0 ]]; then
    log "no request in flight to ${NEMO_UPSTREAM}"
    break
  fi
  if (( SECONDS >= deadline )); then
    log "${n} request(s) still in flight after ${NEMO_LEAVE_SECONDS}s: going on (they are cut)"
    break
  fi
  sleep 2
done
finish "\"upstream\":\"${NEMO_UPSTREAM}\",\"left\":true"
