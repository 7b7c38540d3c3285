# shellcheck shell=bash
# member (on the Caddy balancer): replica NEMO_REPLICA enters the pool, ready, by a file of its
# own in the upstreams folder and a graceful reload (requests in flight finish on the old
# configuration). Run with NEMO_ACTION=leave (the Command's delete, before the replica's
# Droplet is replaced or removed) it leaves: its file goes, Caddy reloads, and the phase waits
# until no request is in flight to it (the admin API's /reverse_proxy/upstreams), at most
# NEMO_LEAVE_SECONDS.
# With the front's router (NEMO_ROUTER=on, balancer.routing cache-aware: components/host/
# router.py), Caddy's one upstream for the API is the router, which picks the replica: the file
# and the reload stay (the public /health, the waker and the router's start script read the
# files), and the replica joins the router by its admin route POST /add_worker (it waits for
# the replica's /health) and leaves it by /remove_worker; the wait is then on the router's gauge
# of requests in flight to it (Caddy counts only the router).
# A join ends with the file's join mark (NEMO_UPSTREAM_JOINED_FILE, beside it, which the import
# glob does not match), written once Caddy's reload (and the router's add_worker) is done: the
# front's waker (scripts/phases/wake/looks.py) counts the replica ready, and drops its hold, only
# with a mark as new as the file. Before the reload Caddy has no such upstream, and a request
# it sent to the replicas would get its 503 "no upstreams". A leave removes the mark first.
# Settings: NEMO_REPLICA NEMO_UPSTREAM NEMO_UPSTREAM_FILE NEMO_UPSTREAM_LINE NEMO_UPSTREAMS_DIR
#           NEMO_UPSTREAM_JOINED_FILE
#           NEMO_ADMIN_SOCKET NEMO_CADDY_UNIT NEMO_CADDY_BIN NEMO_LEAVE_SECONDS
#           NEMO_ROUTER NEMO_ROUTER_ADDRESS NEMO_ROUTER_METRICS NEMO_ROUTER_UNIT
#           NEMO_ROUTER_GAUGE NEMO_WORKER_URL NEMO_ROUTER_JOIN_SECONDS

action=${NEMO_ACTION:-join}
[[ $action == join || $action == leave ]] \
  || fail "NEMO_ACTION=${action}: accepted: join, leave" "report it: the program sets it"

# in_flight: requests in flight to this replica, per Caddy's admin API: a number (0 when Caddy
# does not list it: no request holds it any more), or "?" when the admin API did not answer
# while Caddy runs (a busy front: the wait goes on; a stopped Caddy holds nothing).
in_flight() {
  local page
  if ! page=$(curl --silent --fail --max-time 5 --unix-socket "$NEMO_ADMIN_SOCKET" \
      http://localhost/reverse_proxy/upstreams 2>/dev/null); then
    if systemctl is-active --quiet "$NEMO_CADDY_UNIT"; then echo "?"; else echo 0; fi
    return
  fi
  python3 -c '
import json, sys
want, n = sys.argv[1], 0
for up in json.load(sys.stdin) or []:
    if up.get("address") == want:
        n = up.get("num_requests", 0)
print(n)
' "$NEMO_UPSTREAM" <<<"$page" 2>/dev/null || echo "?"
}

# router_in_flight: requests in flight to this replica per the router's gauge: a number (0 when
# it lists none: removed and its last request ended), or "?" when the router's metrics did not
# answer while it runs (a busy front: the wait goes on; a stopped router holds nothing).
router_in_flight() {
  local page
  if ! page=$(curl --silent --fail --max-time 5 "http://${NEMO_ROUTER_METRICS}/metrics" 2>/dev/null); then
    if systemctl is-active --quiet "$NEMO_ROUTER_UNIT"; then echo "?"; else echo 0; fi
    return
  fi
  awk -v want="${NEMO_ROUTER_GAUGE}{worker=\"${NEMO_WORKER_URL}\"}" \
    '$1 == want { n = int($2) } END { print n + 0 }' <<<"$page"
}

# router_call ROUTE: POST the router's admin ROUTE for this replica (?url=NEMO_WORKER_URL);
# prints its status and body. add_worker answers once the replica's /health does.
router_call() {
  curl --silent --show-error --max-time "$NEMO_ROUTER_JOIN_SECONDS" --request POST \
    --write-out '\n%{http_code}' --get --data-urlencode "url=${NEMO_WORKER_URL}" \
    "http://${NEMO_ROUTER_ADDRESS}/$1" 2>&1 || true
}

# router_join: the router takes this replica. Already there is fine. A router that does not
# answer is (re)started: its start script lists the replicas whose files exist and answer.
router_join() {
  local out code
  out=$(router_call add_worker)
  code=${out##*$'\n'}
  if [[ $code == 200 ]]; then
    log "the router routes to ${NEMO_WORKER_URL}"
  elif [[ $code == 400 && $out == *"already exists"* ]]; then
    log "the router already routes to ${NEMO_WORKER_URL}"
  elif [[ $code == 000 || -z $code ]]; then
    log "the router does not answer: (re)starting ${NEMO_ROUTER_UNIT} (it reads the upstream files)"
    systemctl restart "$NEMO_ROUTER_UNIT" >&2
    local deadline=$((SECONDS + 30))
    until out=$(router_call add_worker); code=${out##*$'\n'}; [[ $code != 000 ]]; do
      (( SECONDS < deadline )) || return 1
      sleep 1
    done
    [[ $code == 200 || ( $code == 400 && $out == *"already exists"* ) ]] || {
      printf '%s\n' "$out" | tail -n 3 | sed "s/^/[$PHASE] router: /" >&2
      return 1
    }
    log "the router routes to ${NEMO_WORKER_URL}"
  else
    printf '%s\n' "$out" | tail -n 3 | sed "s/^/[$PHASE] router: /" >&2
    return 1
  fi
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

joined=$NEMO_UPSTREAM_JOINED_FILE

# marked: the join mark is there and no older than the file (bash's -nt compares the mtimes).
marked() {
  [[ -e $joined && ! $NEMO_UPSTREAM_FILE -nt $joined ]]
}

if [[ $action == join ]]; then
  step file "replica ${NEMO_REPLICA} at ${NEMO_UPSTREAM}: ${NEMO_UPSTREAM_FILE}"
  mkdir -p "$NEMO_UPSTREAMS_DIR"
  if [[ $(cat "$NEMO_UPSTREAM_FILE" 2>/dev/null) == "$NEMO_UPSTREAM_LINE" ]] && marked; then
    log "already in the pool"
  else
    # No mark until Caddy routes to it: the waker keeps holding requests meanwhile.
    rm -f "$joined"
    if [[ $(cat "$NEMO_UPSTREAM_FILE" 2>/dev/null) == "$NEMO_UPSTREAM_LINE" ]]; then
      log "its file is there but its join was not completed: reloading"
    else
      printf '%s\n' "$NEMO_UPSTREAM_LINE" > "${NEMO_UPSTREAM_FILE}.tmp"
      mv "${NEMO_UPSTREAM_FILE}.tmp" "$NEMO_UPSTREAM_FILE"
    fi
    changed
    step reload "graceful reload: new requests may go to replica ${NEMO_REPLICA}"
    if ! reload_caddy; then
      rm -f "$NEMO_UPSTREAM_FILE"
      fail "Caddy refused the configuration with replica ${NEMO_REPLICA}" \
           "the lines above say why; pulumi up again (the file was removed)"
    fi
  fi
  if [[ $NEMO_ROUTER == on ]]; then
    step router "replica ${NEMO_REPLICA} joins the router at ${NEMO_ROUTER_ADDRESS}"
    router_join || fail "the router did not take replica ${NEMO_REPLICA} (${NEMO_WORKER_URL})" \
                        "the lines above say why; journalctl -u ${NEMO_ROUTER_UNIT}; pulumi up again"
  fi
  if ! marked; then
    step mark "Caddy routes to replica ${NEMO_REPLICA}: ${joined} (the waker counts it ready)"
    printf '%s\n' "$NEMO_UPSTREAM_LINE" > "$joined"
    changed
  fi
  finish "\"upstream\":\"${NEMO_UPSTREAM}\""
fi

step file "replica ${NEMO_REPLICA} at ${NEMO_UPSTREAM} leaves the pool"
# The mark first: the waker stops counting the replica before Caddy stops routing to it.
if [[ -e $joined ]]; then
  rm -f "$joined"
  changed
fi
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
if [[ $NEMO_ROUTER == on ]]; then
  step router "replica ${NEMO_REPLICA} leaves the router at ${NEMO_ROUTER_ADDRESS}"
  out=$(router_call remove_worker)
  if [[ ${out##*$'\n'} == 200 ]]; then
    log "the router sends no new request to ${NEMO_WORKER_URL}"
  else
    # Not running: nothing is in flight through it, and its start script reads the files.
    log "the router did not answer remove_worker (${out##*$'\n'}): going on"
  fi
fi

step drain "wait for the requests in flight to ${NEMO_UPSTREAM} (at most ${NEMO_LEAVE_SECONDS}s)"
deadline=$((SECONDS + NEMO_LEAVE_SECONDS))
while true; do
  if [[ $NEMO_ROUTER == on ]]; then
    n=$(router_in_flight)
  else
    n=$(in_flight)
  fi
  if [[ $n == 0 ]]; then
    log "no request in flight to ${NEMO_UPSTREAM}"
    break
  fi
  if (( SECONDS >= deadline )); then
    if [[ $n == "?" ]]; then
      log "could not read the requests in flight to ${NEMO_UPSTREAM} for ${NEMO_LEAVE_SECONDS}s: going on"
    else
      log "${n} request(s) still in flight after ${NEMO_LEAVE_SECONDS}s: going on (they are cut)"
    fi
    break
  fi
  sleep 2
done
finish "\"upstream\":\"${NEMO_UPSTREAM}\",\"left\":true"
