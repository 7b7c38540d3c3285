# shellcheck shell=bash
# router (on the Caddy balancer, the front): vLLM's own router (vllm-router) on the front's
# loopback, behind Caddy, when balancer.routing is cache-aware. Installed from the committed,
# hash-pinned lock with uv (PyPI's wheel, its sha256 checked before use) into a venv of
# Ubuntu's python3; run by its unit from the start script (components/host/router.py).
# Off: removes the unit, the start script, the venv, the lock's copy and uv if an earlier run
# installed them. On, it runs before the gateway, whose Caddyfile then proxies to it; off,
# after the gateway, once the new Caddyfile no longer does.
# Settings: NEMO_ROUTER_MODE (on|off) NEMO_UV_VERSION NEMO_UV_WHEEL_URL NEMO_UV_WHEEL_SHA256
#           NEMO_UV_BIN NEMO_ROUTER_LOCK_TEXT NEMO_ROUTER_LOCK_PATH NEMO_ROUTER_PREFIX
#           NEMO_ROUTER_PYTHON NEMO_ROUTER_PYTHON_VERSION NEMO_ROUTER_BIN NEMO_ROUTER_START_TEXT
#           NEMO_ROUTER_START_SCRIPT NEMO_ROUTER_UNIT NEMO_ROUTER_UNIT_TEXT NEMO_ROUTER_ADDRESS
#           NEMO_ROUTER_METRICS_ADDRESS

unit=/etc/systemd/system/$NEMO_ROUTER_UNIT
uv_dir=$(dirname "$NEMO_UV_BIN")
stamp=$NEMO_ROUTER_PREFIX/.nemotron-lock
# One uv cache, as the vllm phase's: an install that is retried reuses what it downloaded.
export UV_CACHE_DIR=/var/cache/nemotron/uv UV_HTTP_TIMEOUT=120

if [[ $NEMO_ROUTER_MODE == off ]]; then
  step remove "routing is not cache-aware: no router"
  if [[ -f $unit ]]; then
    systemctl disable --now "$NEMO_ROUTER_UNIT" >&2 || true
    rm -f "$unit"
    systemctl daemon-reload >&2
    changed
  fi
  # Whether or not a unit was written: a run cut before it may have left the rest.
  for file in "$NEMO_ROUTER_START_SCRIPT" "$NEMO_ROUTER_LOCK_PATH"; do
    if [[ -e $file ]]; then rm -f "$file"; changed; fi
  done
  for dir in "$NEMO_ROUTER_PREFIX" "$uv_dir"; do
    if [[ -e $dir ]]; then rm -rf "$dir"; changed; fi
  done
  if [[ $CHANGED == true ]]; then log "removed the router, its venv and uv"; else log "no router installed"; fi
  finish '"router":"off"'
fi

restart=false
step python "${NEMO_ROUTER_PYTHON} is Python ${NEMO_ROUTER_PYTHON_VERSION}, the lock's"
python_version=$("$NEMO_ROUTER_PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) \
  || fail "${NEMO_ROUTER_PYTHON} does not run" \
          "the front's image must be Ubuntu 24.04, whose python3 is ${NEMO_ROUTER_PYTHON_VERSION}"
[[ $python_version == "$NEMO_ROUTER_PYTHON_VERSION" ]] \
  || fail "${NEMO_ROUTER_PYTHON} is Python ${python_version}, the router's lock is for ${NEMO_ROUTER_PYTHON_VERSION}" \
          "the front's image must be Ubuntu 24.04 (python3 ${NEMO_ROUTER_PYTHON_VERSION}), or lock the router for ${python_version} (scripts/lock-vllm.sh --router)"

step uv "uv ${NEMO_UV_VERSION} at ${NEMO_UV_BIN}, from PyPI's wheel (sha256 checked before use)"
if [[ -x $NEMO_UV_BIN ]] && [[ $("$NEMO_UV_BIN" --version 2>/dev/null) == "uv ${NEMO_UV_VERSION}"* ]]; then
  log "uv ${NEMO_UV_VERSION} is there"
else
  wheel=$STATE_DIR/downloads/$(basename "$NEMO_UV_WHEEL_URL")
  download "$NEMO_UV_WHEEL_URL" "$wheel" "$NEMO_UV_WHEEL_SHA256"
  mkdir -p "$uv_dir"
  # A wheel is a zip: its static binary is uv-<version>.data/scripts/uv.
  python3 - "$wheel" "uv-${NEMO_UV_VERSION}.data/scripts/uv" "$NEMO_UV_BIN.part" <<'PY' \
    || fail "no uv-${NEMO_UV_VERSION}.data/scripts/uv in $(basename "$NEMO_UV_WHEEL_URL")" \
            "pin a uv wheel for manylinux x86_64 (catalog.UV_WHEEL_URL and UV_WHEEL_SHA256)"
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel, wheel.open(sys.argv[2]) as member, open(sys.argv[3], "wb") as out:
    shutil.copyfileobj(member, out)
PY
  rm -f "$wheel"
  chmod 755 "$NEMO_UV_BIN.part"
  mv "$NEMO_UV_BIN.part" "$NEMO_UV_BIN"
  got=$("$NEMO_UV_BIN" --version 2>&1) || true
  [[ $got == "uv ${NEMO_UV_VERSION}"* ]] \
    || fail "the uv taken out of the wheel says ${got:-nothing}, not uv ${NEMO_UV_VERSION}" \
            "pin the wheel of uv ${NEMO_UV_VERSION} (catalog.UV_WHEEL_URL and UV_WHEEL_SHA256)"
  log "installed ${got}"
  changed
fi

step lock "the router's lock at ${NEMO_ROUTER_LOCK_PATH}"
mkdir -p "$(dirname "$NEMO_ROUTER_LOCK_PATH")"
if printf '%s\n' "$NEMO_ROUTER_LOCK_TEXT" | install_file "$NEMO_ROUTER_LOCK_PATH" 644; then changed; fi
lock_sha=$(sha256sum "$NEMO_ROUTER_LOCK_PATH" | cut -d' ' -f1)

step venv "a venv of ${NEMO_ROUTER_PYTHON} at ${NEMO_ROUTER_PREFIX}"
if [[ -x $NEMO_ROUTER_PREFIX/bin/python ]] \
  && [[ $(readlink -f "$NEMO_ROUTER_PREFIX/bin/python") == "$(readlink -f "$NEMO_ROUTER_PYTHON")" ]]; then
  log "the venv is there"
else
  rm -rf "$NEMO_ROUTER_PREFIX"
  bounded 120 "$NEMO_UV_BIN" venv --quiet --python "$NEMO_ROUTER_PYTHON" "$NEMO_ROUTER_PREFIX" >&2
  changed
fi

step install "vllm-router and its dependencies from the lock (hashes required)"
if [[ -x $NEMO_ROUTER_BIN ]] && [[ $(cat "$stamp" 2>/dev/null) == "$lock_sha" ]]; then
  log "installed from this lock already (sha256 ${lock_sha})"
else
  rm -f "$stamp"
  retry 3 bounded 240 "$NEMO_UV_BIN" pip install --python "$NEMO_ROUTER_PREFIX/bin/python" \
      --require-hashes --no-deps --requirement "$NEMO_ROUTER_LOCK_PATH" >&2 \
    || fail "uv could not install the router's locked packages" \
            "read uv's lines above: check the front's outbound network to PyPI (files.pythonhosted.org); pulumi up again"
  [[ -x $NEMO_ROUTER_BIN ]] \
    || fail "uv installed the lock, yet there is no ${NEMO_ROUTER_BIN}" \
            "the lock must pin vllm-router (scripts/lock-vllm.sh --router); pulumi up again"
  printf '%s\n' "$lock_sha" > "$stamp"
  changed
  restart=true
fi

step start-script "${NEMO_ROUTER_START_SCRIPT}"
mkdir -p "$(dirname "$NEMO_ROUTER_START_SCRIPT")"
if printf '%s\n' "$NEMO_ROUTER_START_TEXT" | install_file "$NEMO_ROUTER_START_SCRIPT" 755; then
  changed
  restart=true
fi

step unit "${unit}"
if printf '%s\n' "$NEMO_ROUTER_UNIT_TEXT" | install_unit "$NEMO_ROUTER_UNIT"; then
  changed
  restart=true
fi

step start "enable and (re)start ${NEMO_ROUTER_UNIT}"
# A restart sends new requests past the old router first (its unit's ExecStop removes the file
# Caddy routes to it by), then waits while it finishes the streams it holds (TimeoutStopSec,
# router.STOP_SECONDS; this phase's bound holds it); its start waits until it answers.
start_unit "$NEMO_ROUTER_UNIT" "$restart"

# /liveness answers 200 once it listens, with or without replicas (/health and chat do not
# say: with none, /health answers 200 and chat 503).
step answers "the router answers on ${NEMO_ROUTER_ADDRESS} and its metrics on ${NEMO_ROUTER_METRICS_ADDRESS}"
answered=false
for _ in $(seq 100); do
  if curl --silent --fail --max-time 2 --output /dev/null "http://${NEMO_ROUTER_ADDRESS}/liveness" \
    && curl --silent --fail --max-time 2 --output /dev/null "http://${NEMO_ROUTER_METRICS_ADDRESS}/metrics"; then
    answered=true
    break
  fi
  sleep 0.3
done
if [[ $answered != true ]]; then
  journalctl -u "$NEMO_ROUTER_UNIT" -n 20 --no-pager 2>/dev/null | sed "s/^/[$PHASE] journal: /" >&2 || true
  fail "the router did not answer on ${NEMO_ROUTER_ADDRESS}/liveness and ${NEMO_ROUTER_METRICS_ADDRESS}/metrics within 30 s" \
       "read the journal lines above (journalctl -u ${NEMO_ROUTER_UNIT}); pulumi up again"
fi
log "the router answers (vllm-router from the lock ${lock_sha:0:12})"
finish '"router":"on"'
