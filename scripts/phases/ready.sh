# shellcheck shell=bash
# ready: wait, on the Droplet, until a 1-token chat completion answers through the gateway
# (its real TLS, routes and key; the name resolved to this host, so no DNS is needed); report
# how long it took. On failure, print the last lines of the service's journal.
# Settings: NEMO_PROBE_URL NEMO_PROBE_RESOLVE NEMO_PROBE_CA NEMO_SERVED_NAME NEMO_UNIT
#           NEMO_ENV_FILE NEMO_READY_TIMEOUT

url=$NEMO_PROBE_URL
tls=()
[[ -n $NEMO_PROBE_CA ]] && tls=(--cacert "$NEMO_PROBE_CA")
body=$(printf '{"model":"%s","messages":[{"role":"user","content":"Say OK."}],"max_tokens":1}' "$NEMO_SERVED_NAME")
journal() { journalctl --unit "$NEMO_UNIT" --lines 60 --no-pager --output cat 2>&1 | sed "s/^/[$PHASE] journal: /" >&2; }

step wait "a 1-token chat completion from ${NEMO_SERVED_NAME} (at most ${NEMO_READY_TIMEOUT}s)"
deadline=$((SECONDS + NEMO_READY_TIMEOUT))
started=$SECONDS
while true; do
  # The key comes from the service's root-only EnvironmentFile, through a pipe, not argv.
  key=$(sed -n 's/^VLLM_API_KEY=//p' "$NEMO_ENV_FILE")
  if answer=$(curl --silent --fail --max-time 60 --resolve "$NEMO_PROBE_RESOLVE" "${tls[@]}" \
      --header @<(printf 'Authorization: Bearer %s\n' "$key") --header 'Content-Type: application/json' \
      --data "$body" "$url" 2>/dev/null) && [[ $answer == *'"choices"'* ]]; then
    break
  fi
  if systemctl is-failed --quiet "$NEMO_UNIT"; then
    journal
    fail "${NEMO_UNIT} failed while loading the model" \
         "read the journal lines above (python scripts/logs.py --stack <stack> shows more); common causes: out of GPU memory (lower vllm.gpuMemoryUtilization or vllm.maxModelLen), a driver too old"
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
finish "\"ready_seconds\":${waited}"
