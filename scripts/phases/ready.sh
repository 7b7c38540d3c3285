# shellcheck shell=bash
# ready: wait, on the Droplet, until a 1-token chat completion answers through the gateway
# (its real TLS, routes and key; the name resolved to this host, so no DNS is needed); report
# how long it took. A crash ends the wait at once: systemd restarts a crashing vLLM without end
# and never shows it failed, so the phase watches its restarts, and says why from the journal.
# A certificate the CA refuses ends it too: Caddy's log names the ACME problem (RFC 8555 types),
# and a refusal that will not pass (a rate limit) from every issuer Caddy tries fails at once,
# one that may (the CA unreachable, a challenge refused while DNS catches up, a rate limit while
# ZeroSSL is still to try) after NEMO_ACME_PATIENCE seconds.
# A replica behind a balancer (NEMO_DRAIN_FILE set) then ends its drain and waits
# NEMO_REJOIN_SECONDS, until the balancer's checks have seen it healthy, before the next replica
# may start its own update. On the balancer Droplet NEMO_UNIT is empty: no vLLM of its own.
# Settings: NEMO_PROBE_URL NEMO_PROBE_RESOLVE NEMO_PROBE_CA NEMO_SERVED_NAME NEMO_UNIT
#           NEMO_ENV_FILE NEMO_KEY_VAR NEMO_READY_TIMEOUT NEMO_GATEWAY_UNIT NEMO_HOST
#           NEMO_ACME_PATIENCE NEMO_ACME_ISSUERS NEMO_DRAIN_FILE NEMO_REJOIN_SECONDS
#           NEMO_VLLM_ENV NEMO_VLLM_ENV_PREFIX NEMO_RUNS_ENV_FILE

url=$NEMO_PROBE_URL
tls=()
[[ -n $NEMO_PROBE_CA ]] && tls=(--cacert "$NEMO_PROBE_CA")
body=$(printf '{"model":"%s","messages":[{"role":"user","content":"Say OK."}],"max_tokens":1}' "$NEMO_SERVED_NAME")
journal_lines() { journalctl --unit "${NEMO_UNIT:-$NEMO_GATEWAY_UNIT}" --lines 60 --no-pager --output cat 2>&1; }
journal() { journal_lines | sed "s/^/[$PHASE] journal: /" >&2; }
restarts() {
  [[ -n $NEMO_UNIT ]] || { echo 0; return; }
  systemctl show -p NRestarts --value "$NEMO_UNIT" 2>/dev/null || echo 0
}

# why: the fix for what the journal says went wrong.
why() {
  local lines
  lines=$(journal_lines)
  case $lines in
    *"out of memory"*|*OutOfMemoryError*|*"Not enough memory"*|*"No available memory for the cache blocks"*)
      echo "vLLM ran out of GPU memory: lower vllm.gpuMemoryUtilization, vllm.maxModelLen or vllm.maxNumSeqs (or choose a larger droplet.size)" ;;
    *"unrecognized arguments"*|*"error: argument"*|*"invalid choice"*)
      echo "vLLM refused a flag: check vllm.extraArgs against 'vllm serve --help' of the pinned version" ;;
    *"Failed to find C compiler"*)
      echo "Triton found no C compiler: the vllm phase installs one; pulumi up again (or apt-get install gcc on the Droplet)" ;;
    *"driver version is insufficient"*|*"driver is too old"*|*"CUDA driver version"*)
      echo "the NVIDIA driver is too old for vLLM's CUDA: set bootstrap.driver.mode: auto (or a newer bootstrap.driver.branch)" ;;
    *"No space left on device"*)
      echo "the disk is full: choose a size with a larger disk or a smaller model.id" ;;
    *)
      echo "read the journal lines above (nemodrop logs --stack <stack> shows more)" ;;
  esac
}

# acme_detail LINE: the CA's words in one of Caddy's log lines (its "error" field).
acme_detail() {
  local detail
  detail=$(sed -n 's/.*"error":"\(\([^"\\]\|\\.\)*\)".*/\1/p' <<<"$1" | sed 's/\\"/"/g' | cut -c1-400)
  [[ -n $detail ]] || detail=$(cut -c1-400 <<<"$1")
  printf '%s\n' "$detail"
}

# acme_final LINE: whether the CA's refusal in LINE will not pass by itself.
acme_final() {
  case $1 in
    *acme:error:rateLimited*|*acme:error:caa*|*acme:error:rejectedIdentifier*|*acme:error:unsupportedIdentifier*) return 0 ;;
    *) return 1 ;;
  esac
}

# acme_problem: "KIND<TAB>the CA's words" for the newest ACME failure in the gateway's log of
# this boot, or nothing. KIND: final (will not pass by itself) or transient. Caddy tries its
# NEMO_ACME_ISSUERS issuers in order within one attempt (certmagic config.go; docs/facts.md: a Let's
# Encrypt rate limit is followed by a ZeroSSL try), so a refusal is final only once every
# issuer's newest failure is.
acme_problem() {
  local lines line issuer finals=0 final_line=""
  lines=$(journalctl --unit "$NEMO_GATEWAY_UNIT" --boot --lines 400 --no-pager --output cat 2>/dev/null \
    | grep -E '"logger":"tls\.obtain".*"msg":"(could not get certificate from issuer|will retry)"') || true
  [[ -n $lines ]] || return 0
  while IFS= read -r issuer; do
    [[ -n $issuer ]] || continue
    line=$(grep -F "\"issuer\":\"${issuer}\"" <<<"$lines" | tail -n 1)
    if acme_final "$line"; then
      finals=$((finals + 1))
      final_line=$line
    fi
  done < <(sed -n 's/.*"issuer":"\([^"]*\)".*/\1/p' <<<"$lines" | sort -u)
  if (( finals >= NEMO_ACME_ISSUERS )) && [[ -n $final_line ]]; then
    printf 'final\t%s\n' "$(acme_detail "$final_line")"
    return 0
  fi
  # The CA's own words (an RFC 8555 problem type) when it answered; else the newest failure.
  line=$(grep 'urn:ietf:params:acme:error:' <<<"$lines" | tail -n 1) || true
  [[ -n $line ]] || line=$(tail -n 1 <<<"$lines")
  printf 'transient\t%s\n' "$(acme_detail "$line")"
}

# acme_fix DETAIL: what to do about it.
acme_fix() {
  case $1 in
    *rateLimited*)
      echo "the CA's rate limit for ${NEMO_HOST} is used up (sslip.io names share one Let's Encrypt limit with every sslip.io user): set access.domain to a name you control and pulumi up, or wait until the time the CA names" ;;
    *acme:error:caa*)
      echo "a CAA record on ${NEMO_HOST} forbids this CA: allow letsencrypt.org in the domain's CAA records" ;;
    *rejectedIdentifier*|*unsupportedIdentifier*)
      echo "the CA will not issue for ${NEMO_HOST}: choose another access.domain" ;;
    *unauthorized*|*acme:error:connection*|*acme:error:dns*|*incorrectResponse*)
      echo "the CA could not check http://${NEMO_HOST}/.well-known/acme-challenge/ on port 80: point ${NEMO_HOST} at this Droplet's IPv4 (pulumi stack output ipv4) and keep port 80 open, then pulumi up" ;;
    *"dial tcp"*|*"no such host"*|*timeout*|*"connection refused"*)
      echo "the Droplet cannot reach the ACME CA: check its outbound HTTPS (firewall egress, DNS), then pulumi up" ;;
    *)
      echo "read the gateway's log: journalctl -u ${NEMO_GATEWAY_UNIT} on the Droplet" ;;
  esac
}

step wait "a 1-token chat completion from ${NEMO_SERVED_NAME} (at most ${NEMO_READY_TIMEOUT}s)"
deadline=$((SECONDS + NEMO_READY_TIMEOUT))
started=$SECONDS
# Restarts counted since the service phase (re)started it; without its record, from now.
baseline=0
[[ -z $NEMO_UNIT ]] || baseline=$(cat "$STATE_DIR/${NEMO_UNIT%.service}.restarts" 2>/dev/null || restarts)
acme_since=0
while true; do
  # The key comes from the service's root-only EnvironmentFile, through a pipe, not argv.
  key=$(sed -n "s/^${NEMO_KEY_VAR}=//p" "$NEMO_ENV_FILE")
  if answer=$(curl --silent --fail --max-time 60 --resolve "$NEMO_PROBE_RESOLVE" "${tls[@]}" \
      --header @<(printf 'Authorization: Bearer %s\n' "$key") --header 'Content-Type: application/json' \
      --data "$body" "$url" 2>/dev/null) && [[ $answer == *'"choices"'* ]]; then
    break
  fi
  sub=""
  [[ -z $NEMO_UNIT ]] || sub=$(systemctl show -p SubState --value "$NEMO_UNIT" 2>/dev/null || true)
  now=$(restarts)
  if [[ -n $NEMO_UNIT ]] && { [[ $sub == auto-restart ]] || (( now > baseline )) || systemctl is-failed --quiet "$NEMO_UNIT"; }; then
    journal
    fail "${NEMO_UNIT} crashed while loading the model (state ${sub:-unknown}, restarted $((now - baseline)) time(s))" "$(why)"
  fi
  problem=$(acme_problem)
  if [[ -n $problem ]]; then
    kind=${problem%%$'\t'*}
    detail=${problem#*$'\t'}
    (( acme_since )) || acme_since=$SECONDS
    if [[ $kind == final ]] || (( SECONDS - acme_since >= NEMO_ACME_PATIENCE )); then
      fail "the CA did not issue a certificate for ${NEMO_HOST}: ${detail}" "$(acme_fix "$detail")"
    fi
  fi
  if (( SECONDS >= deadline )); then
    journal
    fail "no answer from ${url} after ${NEMO_READY_TIMEOUT}s" \
         "read the journal lines above; a big model may need a longer bootstrap.readyTimeoutMinutes"
  fi
  sleep 5
done
waited=$((SECONDS - started))
log "answered after ${waited}s"

if [[ -n $NEMO_DRAIN_FILE ]]; then
  step rejoin "back in the balancer's pool"
  # A replica answers the entry only once the balancer's checks have passed (a new one starts
  # out of the pool: DigitalOcean's Load Balancer adds a Droplet after healthy_threshold passes),
  # so a first start waits too: `pulumi up` ends when the endpoint serves through the entry.
  if [[ -e $NEMO_DRAIN_FILE ]]; then
    rm -f "$NEMO_DRAIN_FILE"
    changed
    log "/health answers 200 again; waiting ${NEMO_REJOIN_SECONDS}s for the balancer to see it"
  else
    log "not draining; waiting ${NEMO_REJOIN_SECONDS}s for the balancer's checks to pass"
  fi
  sleep "$NEMO_REJOIN_SECONDS"
fi

if [[ -n $NEMO_VLLM_ENV ]]; then
  step old-envs "the vLLM envs before ${NEMO_VLLM_ENV}, now that it answered"
  # Only once the service runs from the unit's env and has answered from it: never the one
  # running, and never the one to go back to before the new one has served.
  if [[ $(cat "$NEMO_RUNS_ENV_FILE" 2>/dev/null) == "$NEMO_VLLM_ENV" ]]; then
    for old in "${NEMO_VLLM_ENV_PREFIX:?}" "${NEMO_VLLM_ENV_PREFIX}"-*; do
      [[ -d $old && $old != "$NEMO_VLLM_ENV" ]] || continue
      log "removing ${old}: the service answers from ${NEMO_VLLM_ENV}"
      rm -rf "$old"
      changed
    done
  fi
fi

step metadata-guard "systemd enforces the units' IPAddressDeny (the metadata service)"
# Without a BPF cgroup firewall systemd starts units with IPAddressDeny= anyway, unfiltered, and
# warns once per boot for whichever unit uses it first (often journald): look for that warning
# in this boot's log (src/core/bpf-firewall.c, emit_bpf_firewall_warning).
if journalctl --boot --no-pager --output cat 2>/dev/null | grep -q "configures an IP firewall, but"; then
  fail "systemd does not enforce IPAddressDeny on this host, so vLLM and Caddy can read the metadata service (the Droplet's user data)" \
       "use bootstrap.cgroup.mode: unified (the default; BPF firewalling needs systemd's unified or hybrid hierarchy) and pulumi up again"
fi
log "no warning that IP firewalling is unsupported in this boot's log"
finish "\"ready_seconds\":${waited}"
