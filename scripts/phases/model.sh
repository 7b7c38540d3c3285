# shellcheck shell=bash
# model: download the weights into the cache the service reads (HF_HOME), after a disk check,
# and the speculative-decoding draft model beside them when one is configured. Weights found
# complete (every file at the size recorded after its download: a cache Volume another Droplet
# filled, or left half-filled) are not fetched again. Runs beside the vllm phase, from its own
# env. A gated model without a token, or a wrong id, fails here with a message that says so.
# A download cut or stalled mid-file (HF_HUB_DOWNLOAD_TIMEOUT) is resumed by hf itself, from
# the last 10 MiB it kept (tests/test_model_download.py, with the locked huggingface_hub); a
# try that failed or was stopped costs only its unfinished files: finished ones stay.
# Settings: NEMO_MODEL_ID NEMO_MODEL_REVISION NEMO_MODEL_DISK_GB NEMO_MODEL_MARKER NEMO_HF_ENV
#           NEMO_HF_HOME NEMO_DRAFT_ID NEMO_DRAFT_DISK_GB (empty/0: no draft)
#           NEMO_HF_TOKEN (secret, may be empty) NEMO_HF_ENDPOINT (may be empty)

export HF_HOME=$NEMO_HF_HOME HF_HUB_DISABLE_TELEMETRY=1 HF_HUB_ETAG_TIMEOUT=60 HF_HUB_DOWNLOAD_TIMEOUT=120
[[ -n ${NEMO_HF_ENDPOINT:-} ]] && export HF_ENDPOINT=$NEMO_HF_ENDPOINT
# The token reaches hf through the environment of this root-owned process, never its arguments.
if [[ -n ${NEMO_HF_TOKEN:-} ]]; then
  export HF_TOKEN=$NEMO_HF_TOKEN
fi
unset NEMO_HF_TOKEN

# snapshot_dir ID REVISION: the folder hf filled for the revision (a branch or tag names a
# commit in refs/).
snapshot_dir() {
  local repo_dir=$HF_HOME/hub/models--${1//\//--} commit=$2
  if [[ -f $repo_dir/refs/$2 ]]; then
    commit=$(<"$repo_dir/refs/$2")
  fi
  printf '%s\n' "$repo_dir/snapshots/$commit"
}

# incomplete_files ID REVISION MANIFEST: its files that are missing or of another size.
incomplete_files() {
  local dir size path
  dir=$(snapshot_dir "$1" "$2")
  tail -n +2 "$3" | while read -r size path; do
    [[ $(stat -L -c %s "$dir/$path" 2>/dev/null) == "$size" ]] || printf '%s\n' "$path"
  done
}

# drop_partials DIR: remove the unfinished files a stopped hf left in a repo's blobs. hf writes
# each file to a name of its own, BLOB.RANDOM.incomplete, and removes it when a download fails
# inside hf; one that was stopped (the phase's bound, a reboot, a cut session) leaves it, and
# no later hf reads it again (huggingface_hub 2.4.0, file_download._download_to_tmp_and_move).
# Left, they would fill the disk (or the cache Volume) a model's size at a time. Only ever
# between two hf runs: the model lock below keeps a second phase's hf away.
drop_partials() {
  local partials mb
  [[ -d $1/blobs ]] || return 0
  partials=$(find "$1/blobs" -maxdepth 1 -ignore_readdir_race -type f -name '*.incomplete' -printf '%s\n')
  [[ -n $partials ]] || return 0
  mb=$(awk '{ n += $1 } END { printf "%.0f", n / 1000000 }' <<<"$partials")
  find "$1/blobs" -maxdepth 1 -ignore_readdir_race -type f -name '*.incomplete' -delete
  log "removed $(grep -c . <<<"$partials") unfinished file(s), ${mb} MB, that a stopped download left"
}

# hf_download ID REVISION WHAT: hf download with three tries; a gated or missing repo fails at
# once with the fix (WHAT names the setting to check).
hf_download() {
  local id=$1 revision=$2 what=$3 attempt=1
  # hf's messages of the last attempt, kept beside the phase's state (never in /tmp, where a
  # failed phase would leave them behind).
  local errors="$STATE_DIR/hf-download.err"
  until bounded 7200 "$NEMO_HF_ENV/bin/hf" download "$id" --revision "$revision" >/dev/null 2>"$errors"; do
    # A try that ran into the bound was stopped, not failed: its unfinished files stay.
    drop_partials "$HF_HOME/hub/models--${id//\//--}"
    tail -n 5 "$errors" | sed "s/^/[$PHASE] hf: /" >&2
    if grep -qiE 'gated|restricted|awaiting a review|401|403' "$errors"; then
      if [[ -n ${HF_TOKEN:-} ]]; then
        fail "${id} is gated and the token was refused" \
             "accept the model's licence on its Hugging Face page with the token's account, or set a token that can read it: pulumi config set --secret hfToken (it asks for the value)"
      fi
      fail "${id} is gated: Hugging Face wants a token" \
           "accept its licence on the model page, then: pulumi config set --secret hfToken (it asks for the value), and pulumi up"
    fi
    if grep -qiE 'RepositoryNotFound|Repository Not Found|RevisionNotFound|404' "$errors"; then
      fail "Hugging Face has no ${id} at revision ${revision}" \
           "check ${what} (the repo id is case-sensitive)"
    fi
    if (( attempt >= 3 )); then
      fail "the download failed 3 times" "check the Droplet's outbound network; pulumi up again fetches only the files not yet complete"
    fi
    log "attempt ${attempt}/3 failed; retrying in $(( ${NEMO_RETRY_DELAY:-2} << attempt ))s"
    sleep $(( ${NEMO_RETRY_DELAY:-2} << attempt ))
    attempt=$((attempt + 1))
  done
  rm -f "$errors"
}

# repo_bytes DIR: bytes in a repo's blobs: its finished files (drop_partials runs first), so a
# file is counted once, when it is whole. -L: hf 2.4.0 moves a Xet-stored repo's finished blob
# into a store shared by the repos (hub/blobs/) and leaves a link in the repo's own blobs
# (_shared_blobs.publish_blob_to_shared_store). %.0f: mawk prints a sum past 2^31 as 5e+09,
# which bash's arithmetic refuses.
repo_bytes() {
  if [[ -d $1/blobs ]]; then
    find -L "$1/blobs" -type f -printf '%s\n' | awk '{ n += $1 } END { printf "%.0f\n", n }'
  else
    echo 0
  fi
}

# fetch ID REVISION DISK_GB MARKER WHAT: make ID@REVISION complete in HF_HOME; says in one line
# when it already was. Sets FILES to its file count.
fetch() {
  local id=$1 revision=$2 disk_gb=$3 marker=$4 what=$5
  local manifest=${marker}.manifest want="${1}@${2}" missing dir free_gb size
  step cached "is ${want} already complete in ${HF_HOME}?"
  if [[ -f $marker && $(<"$marker") == "$want" && -f $manifest && $(head -n 1 "$manifest") == "$want" ]]; then
    FILES=$(( $(wc -l < "$manifest") - 1 ))
    missing=$(incomplete_files "$id" "$revision" "$manifest")
    if [[ -z $missing ]]; then
      log "complete: ${want}, all ${FILES} files at their sizes, $(cache_note); no download"
      return 0
    fi
    log "incomplete: $(grep -c . <<<"$missing") of ${FILES} files of ${want} are missing or short ($(head -n 3 <<<"$missing" | paste -sd ' ')); downloading them"
  elif [[ -f $marker ]]; then
    log "the cache holds $(<"$marker"), not ${want}: downloading ${want} (files they share are not fetched again)"
  fi

  step disk "free disk for about ${disk_gb} GB of ${id}"
  mkdir -p "$HF_HOME"
  free_gb=$(df --output=avail -BG "$HF_HOME" | tail -n 1 | tr -dc '0-9')
  if (( free_gb < disk_gb + 2 )) && mountpoint -q "$HF_HOME"; then
    # HF_HOME is the cache Volume's folder (the cache phase binds it): a larger cache.sizeGb
    # grows the Volume in place and re-runs the cache phase, which grows its filesystem.
    fail "${free_gb} GB free in ${HF_HOME} (on the cache Volume), ${id} needs about ${disk_gb} GB" \
         "raise cache.sizeGb (pulumi up grows the Volume and its filesystem in place), or choose a smaller model (model.id)"
  elif (( free_gb < disk_gb + 2 )); then
    fail "${free_gb} GB free in ${HF_HOME}, ${id} needs about ${disk_gb} GB" \
         "choose a size with a larger disk or a smaller model (model.id), or set cache.sizeGb to keep the weights on a Volume"
  fi

  step download "hf download ${want}"
  rm -f "$marker" "$manifest"
  local repo_dir=$HF_HOME/hub/models--${id//\//--} before after started elapsed_ms
  drop_partials "$repo_dir"
  before=$(repo_bytes "$repo_dir")
  started=$(date +%s%N)
  hf_download "$id" "$revision" "$what"
  after=$(repo_bytes "$repo_dir")
  elapsed_ms=$(( ($(date +%s%N) - started) / 1000000 ))
  # What this run moved over the network, and how long it took (the timeline's rate).
  # Never below 0: hf may drop a stale partial blob before it fetches the file again.
  (( after > before )) && DOWNLOAD_BYTES=$(( DOWNLOAD_BYTES + after - before ))
  DOWNLOAD_MS=$(( DOWNLOAD_MS + elapsed_ms ))
  log "fetched $(( (after - before) / 1000000 )) MB in $(( elapsed_ms / 1000 )) s"

  step manifest "record every file of ${want} and its size"
  dir=$(snapshot_dir "$id" "$revision")
  [[ -d $dir ]] || fail "hf finished but there is no ${dir}" "pulumi up again; if it persists, check ${what}"
  { printf '%s\n' "$want"; (cd "$dir" && find -L . -type f -printf '%s %P\n' | LC_ALL=C sort); } > "${manifest}.tmp"
  mv "${manifest}.tmp" "$manifest"
  FILES=$(( $(wc -l < "$manifest") - 1 ))
  size=$(du -shL "$HF_HOME/hub/models--${id//\//--}" | cut -f1)
  printf '%s\n' "$want" > "$marker"
  changed
  log "downloaded ${want} (${FILES} files, ${size})"
}

# One model phase at a time: a phase whose SSH session was cut runs on to its bound, and the
# next pulumi up's must not remove the files its hf is still writing. Held until this exits.
mkdir -p "$STATE_DIR"
exec 9>"$STATE_DIR/model.lock"
if ! flock --nonblock 9; then
  log "the model phase an earlier pulumi up started is still running: waiting for it"
  flock 9
fi

FILES=0 DOWNLOAD_BYTES=0 DOWNLOAD_MS=0
fetch "$NEMO_MODEL_ID" "$NEMO_MODEL_REVISION" "$NEMO_MODEL_DISK_GB" "$NEMO_MODEL_MARKER" "model.id and model.revision"
model_files=$FILES
draft=""
if [[ -n ${NEMO_DRAFT_ID:-} ]]; then
  # The draft's main branch: what its publisher trained for the target's release.
  fetch "$NEMO_DRAFT_ID" main "$NEMO_DRAFT_DISK_GB" "${NEMO_MODEL_MARKER}.draft" "vllm.speculative.model"
  draft=",\"draft\":\"${NEMO_DRAFT_ID}@main\",\"draft_files\":${FILES}"
fi
finish "\"model\":\"${NEMO_MODEL_ID}@${NEMO_MODEL_REVISION}\",\"files\":${model_files}${draft},\"download_bytes\":${DOWNLOAD_BYTES},\"download_seconds\":$((DOWNLOAD_MS / 1000)).$(printf '%03d' $((DOWNLOAD_MS % 1000)))"
