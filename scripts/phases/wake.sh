# shellcheck shell=bash
# wake (on the Caddy balancer, the front): the waker (the package wake/, shipped in one folder
# with the clients it imports, clients/) as a service on loopback, to which the gateway sends
# keyed requests while no replica is ready, and which holds them while the GPU set wakes.
# Its token (the pipeline's) is a root-only file the unit reads as a systemd credential; its
# settings a root-only env file. Off: removes the service and the token if an earlier run
# installed them. Runs before the gateway, whose Caddyfile then routes through it.
# Settings: NEMO_WAKE_MODE (on|off) NEMO_WAKE_TREE NEMO_WAKE_DIR NEMO_WAKE_OLD_SCRIPT
#           NEMO_WAKE_ENV_FILE NEMO_WAKE_ENV_TEXT NEMO_WAKE_TOKEN_FILE NEMO_WAKE_TOKEN (secret) NEMO_WAKE_UNIT
#           NEMO_WAKE_UNIT_TEXT NEMO_WAKE_ADDRESS NEMO_WAKE_PYTHON NEMO_WAKE_PACKAGE
#           NEMO_UPSTREAMS_DIR NEMO_JOINED_SUFFIX NEMO_CADDY_UNIT (join marks: step marks)
#           NEMO_WAKE_OLD_KEY_FILE (the API key the retired autoscaler kept on the front to
#           read the replicas' /metrics: removed wherever a front still has it)

unit=/etc/systemd/system/$NEMO_WAKE_UNIT
token=$NEMO_WAKE_TOKEN
unset NEMO_WAKE_TOKEN

if [[ $NEMO_WAKE_MODE == off ]]; then
  step remove "wake is off: no waker, no token"
  if [[ -f $unit ]]; then
    systemctl disable --now "$NEMO_WAKE_UNIT" >&2 || true
    rm -f "$unit"
    systemctl daemon-reload >&2
    changed
  fi
  # Whether or not a unit was written: a run cut before it may have left the token.
  for file in "$NEMO_WAKE_TOKEN_FILE" "$NEMO_WAKE_OLD_KEY_FILE" "$NEMO_WAKE_ENV_FILE" "$NEMO_WAKE_OLD_SCRIPT"; do
    if [[ -e $file ]]; then rm -f "$file"; changed; fi
  done
  if [[ -e $NEMO_WAKE_DIR ]]; then rm -rf "$NEMO_WAKE_DIR"; changed; fi
  if [[ $CHANGED == true ]]; then log "removed the waker and its token"; else log "no waker installed"; fi
  finish '"wake":"off"'
fi

restart=false
step aiohttp "${NEMO_WAKE_PACKAGE}: the waker's HTTP server and client, from Ubuntu's archive"
if "$NEMO_WAKE_PYTHON" -c 'import aiohttp' 2>/dev/null; then
  log "aiohttp $("$NEMO_WAKE_PYTHON" -c 'import aiohttp; print(aiohttp.__version__)') is there"
else
  apt_install "$NEMO_WAKE_PACKAGE"
  "$NEMO_WAKE_PYTHON" -c 'import aiohttp' \
    || fail "${NEMO_WAKE_PACKAGE} installed, yet ${NEMO_WAKE_PYTHON} cannot import aiohttp" \
            "run ${NEMO_WAKE_PYTHON} -c 'import aiohttp' on the front to see why; pulumi up again"
  changed
  restart=true
fi

step package "${NEMO_WAKE_DIR}: the waker's package and its clients (replaced only when a file changed)"
if printf '%s\n' "$NEMO_WAKE_TREE" | install_tree "$NEMO_WAKE_DIR"; then changed; restart=true; fi
# install_tree swapped the whole folder: a front upgraded from the package alone at this path
# keeps none of its files. The waker was one file before that: a front upgraded from it keeps
# none either.
if [[ -e $NEMO_WAKE_OLD_SCRIPT ]]; then
  rm -f "$NEMO_WAKE_OLD_SCRIPT"
  log "removed ${NEMO_WAKE_OLD_SCRIPT} (the single-file waker of earlier releases)"
  changed
  restart=true
fi

step token "root-only ${NEMO_WAKE_TOKEN_FILE} (the pipeline's token, read by the unit as a credential)"
[[ -n $token ]] || fail "no wake.token was given" "pulumi config set --secret --path wake.token (it asks for the token), then pulumi up"
if printf '%s\n' "$token" | install_secret "$NEMO_WAKE_TOKEN_FILE"; then changed; restart=true; fi

# The waker reads no replica's /metrics any more: no copy of the API key stays on the front.
if [[ -e $NEMO_WAKE_OLD_KEY_FILE ]]; then
  step old-key "remove ${NEMO_WAKE_OLD_KEY_FILE} (the retired autoscaler's copy of the API key)"
  rm -f "$NEMO_WAKE_OLD_KEY_FILE"
  changed
  restart=true
fi

step env-file "root-only ${NEMO_WAKE_ENV_FILE}"
if printf '%s\n' "$NEMO_WAKE_ENV_TEXT" | install_secret "$NEMO_WAKE_ENV_FILE"; then changed; restart=true; fi

step unit "${unit}"
if printf '%s\n' "$NEMO_WAKE_UNIT_TEXT" | install_unit "$NEMO_WAKE_UNIT"; then
  changed
  restart=true
fi

# The waker counts a replica ready only with its join mark, which the member phase writes after
# Caddy's reload (member.sh). A replica that joined before marks existed has none: a graceful
# reload (Caddy then routes to every file there) and a mark for each, before the waker starts,
# so an awake front stays awake. Marked already (a join since): nothing to do.
step marks "join marks for the replicas in ${NEMO_UPSTREAMS_DIR} that joined before them"
unmarked=()
for file in "$NEMO_UPSTREAMS_DIR"/*.caddy; do
  [[ -e $file && ! -e ${file}${NEMO_JOINED_SUFFIX} ]] && unmarked+=("$file")
done
if (( ${#unmarked[@]} == 0 )); then
  log "every replica's join is marked"
elif systemctl is-active --quiet "$NEMO_CADDY_UNIT" && ! systemctl reload "$NEMO_CADDY_UNIT" >&2; then
  # Their member phases reload and mark them (a join without its mark starts over).
  log "${NEMO_CADDY_UNIT} did not reload: ${#unmarked[@]} replica(s) left to their member phase"
else
  for file in "${unmarked[@]}"; do
    cp "$file" "${file}${NEMO_JOINED_SUFFIX}"
    log "marked ${file##*/}: Caddy routes to it"
  done
  changed
fi

step start "enable and (re)start ${NEMO_WAKE_UNIT}"
start_unit "$NEMO_WAKE_UNIT" "$restart"

step answers "the waker answers on ${NEMO_WAKE_ADDRESS}"
answered=false
for _ in $(seq 50); do
  # /health answers 200 awake and 503 otherwise: any answer is the waker's.
  if health=$(curl --silent --max-time 2 "http://${NEMO_WAKE_ADDRESS}/health"); then
    log "the waker answers; the set is $(python3 -c 'import json,sys; print(json.load(sys.stdin)["status"])' <<<"$health" 2>/dev/null || echo unknown)"
    answered=true
    break
  fi
  sleep 0.2
done
if [[ $answered != true ]]; then
  journalctl -u "$NEMO_WAKE_UNIT" -n 20 --no-pager 2>/dev/null | sed "s/^/[$PHASE] journal: /" >&2 || true
  fail "the waker did not answer on ${NEMO_WAKE_ADDRESS} within 10 s" \
       "read the journal lines above (journalctl -u ${NEMO_WAKE_UNIT}); pulumi up again"
fi

# What the waker found when it asked the pipeline on start (wake/pipeline.py check_pipeline): a token
# GitHub refuses, a workflow that is not there or is disabled fails this phase now, not the
# first wake a month from now; a token that ends soon, or GitHub out of reach, is said.
step pipeline "the waker's look at the pipeline: the workflow, the token and its expiry"
verdict=""
for _ in $(seq 3); do
  # A fresh look (?pipeline=check), not the last one: a fix that changed nothing on this front
  # (a workflow enabled again, a token given more permissions) must not meet the old answer.
  if state=$(curl --silent --max-time 60 "http://${NEMO_WAKE_ADDRESS}/nemotron/wake?pipeline=check"); then
    verdict=$(python3 -c '
import json, sys
p = json.load(sys.stdin).get("pipeline") or {}
if p:
    print("problem" if p.get("problem") else "warning" if p.get("warning") else "ok",
          p.get("problem") or p.get("warning") or "a wake can start; the token expires "
          + str(p.get("token_expires") or "never"), sep="\t")' <<<"$state" 2>/dev/null || true)
    [[ -n $verdict ]] && break
  fi
  sleep 0.2
done
case "${verdict%%$'\t'*}" in
  ok) log "${verdict#*$'\t'}" ;;
  warning) log "warning: ${verdict#*$'\t'}" ;;
  problem) fail "a wake could not start: ${verdict#*$'\t'}" \
                "mend it and pulumi up again (this phase asks the waker to look again)" ;;
  *) log "warning: the waker did not say whether a wake could start" ;;
esac
finish '"wake":"on"'
