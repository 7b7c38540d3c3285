# shellcheck shell=bash
# model: download the weights into the cache the service reads (HF_HOME), after a disk check.
# Runs beside the vllm phase, from its own env. A gated model without a token, or a wrong id,
# fails here with a message that says so.
# Settings: NEMO_MODEL_ID NEMO_MODEL_REVISION NEMO_MODEL_DISK_GB NEMO_HF_ENV NEMO_HF_HOME
#           NEMO_HF_TOKEN (secret, may be empty) NEMO_HF_ENDPOINT (may be empty)

export HF_HOME=$NEMO_HF_HOME HF_HUB_DISABLE_TELEMETRY=1 HF_HUB_ETAG_TIMEOUT=60 HF_HUB_DOWNLOAD_TIMEOUT=120
[[ -n ${NEMO_HF_ENDPOINT:-} ]] && export HF_ENDPOINT=$NEMO_HF_ENDPOINT
# The token reaches hf through the environment of this root-owned process, never its arguments.
if [[ -n ${NEMO_HF_TOKEN:-} ]]; then
  export HF_TOKEN=$NEMO_HF_TOKEN
fi
unset NEMO_HF_TOKEN
marker=$NEMO_MODEL_MARKER
# Every file of the snapshot with its size, written after a download: what "complete" means for
# weights found on a cache Volume that another Droplet filled (or left half-filled).
manifest=${marker}.manifest
want="${NEMO_MODEL_ID}@${NEMO_MODEL_REVISION}"
repo_dir=$HF_HOME/hub/models--${NEMO_MODEL_ID//\//--}

# snapshot_dir: the folder hf filled for the revision (a branch or tag names a commit in refs/).
snapshot_dir() {
  local commit=$NEMO_MODEL_REVISION
  if [[ -f $repo_dir/refs/$NEMO_MODEL_REVISION ]]; then
    commit=$(<"$repo_dir/refs/$NEMO_MODEL_REVISION")
  fi
  printf '%s\n' "$repo_dir/snapshots/$commit"
}

# incomplete_files: the manifest's files that are missing or of another size, one per line.
incomplete_files() {
  local dir size path
  dir=$(snapshot_dir)
  tail -n +2 "$manifest" | while read -r size path; do
    [[ $(stat -L -c %s "$dir/$path" 2>/dev/null) == "$size" ]] || printf '%s\n' "$path"
  done
}

step cached "is ${want} already complete in ${HF_HOME}?"
if [[ -f $marker && $(<"$marker") == "$want" && -f $manifest && $(head -n 1 "$manifest") == "$want" ]]; then
  files=$(( $(wc -l < "$manifest") - 1 ))
  missing=$(incomplete_files)
  if [[ -z $missing ]]; then
    log "complete: ${want}, all ${files} files at their sizes, $(cache_note); no download"
    finish "\"model\":\"${want}\",\"files\":${files}"
  fi
  log "incomplete: $(grep -c . <<<"$missing") of ${files} files of ${want} are missing or short ($(head -n 3 <<<"$missing" | paste -sd ' ')); downloading them"
elif [[ -f $marker ]]; then
  log "the cache holds $(<"$marker"), not ${want}: downloading ${want} (files they share are not fetched again)"
fi

step disk "free disk for about ${NEMO_MODEL_DISK_GB} GB of weights"
mkdir -p "$HF_HOME"
free_gb=$(df --output=avail -BG "$HF_HOME" | tail -n 1 | tr -dc '0-9')
if (( free_gb < NEMO_MODEL_DISK_GB + 2 )); then
  fail "${free_gb} GB free in ${HF_HOME}, the weights need about ${NEMO_MODEL_DISK_GB} GB" \
       "choose a size with a larger disk or a smaller model (model.id)"
fi

step download "hf download ${want}"
rm -f "$marker" "$manifest"
# hf's messages of the last attempt, kept beside the phase's state (never in /tmp, where a
# failed phase would leave them behind).
errors="$STATE_DIR/hf-download.err"
attempt=1
until bounded 7200 "$NEMO_HF_ENV/bin/hf" download "$NEMO_MODEL_ID" --revision "$NEMO_MODEL_REVISION" >/dev/null 2>"$errors"; do
  tail -n 5 "$errors" | sed "s/^/[$PHASE] hf: /" >&2
  if grep -qiE 'gated|restricted|awaiting a review|401|403' "$errors"; then
    if [[ -n ${HF_TOKEN:-} ]]; then
      fail "${NEMO_MODEL_ID} is gated and the token was refused" \
           "accept the model's licence on its Hugging Face page with the token's account, or set a token that can read it (pulumi config set --secret hfToken ...)"
    fi
    fail "${NEMO_MODEL_ID} is gated: Hugging Face wants a token" \
         "accept its licence on the model page, then: pulumi config set --secret hfToken hf_..."
  fi
  if grep -qiE 'RepositoryNotFound|Repository Not Found|RevisionNotFound|404' "$errors"; then
    fail "Hugging Face has no ${NEMO_MODEL_ID} at revision ${NEMO_MODEL_REVISION}" \
         "check model.id and model.revision (the repo id is case-sensitive)"
  fi
  if (( attempt >= 3 )); then
    fail "the download failed 3 times" "check the Droplet's outbound network; pulumi up again resumes the download"
  fi
  log "attempt ${attempt}/3 failed; retrying in $(( ${NEMO_RETRY_DELAY:-2} << attempt ))s"
  sleep $(( ${NEMO_RETRY_DELAY:-2} << attempt ))
  attempt=$((attempt + 1))
done
rm -f "$errors"

step manifest "record every file of ${want} and its size"
dir=$(snapshot_dir)
[[ -d $dir ]] || fail "hf finished but there is no ${dir}" "pulumi up again; if it persists, check model.revision"
{ printf '%s\n' "$want"; (cd "$dir" && find -L . -type f -printf '%s %P\n' | LC_ALL=C sort); } > "${manifest}.tmp"
mv "${manifest}.tmp" "$manifest"
files=$(( $(wc -l < "$manifest") - 1 ))
size=$(du -sh "$repo_dir" | cut -f1)
printf '%s\n' "$want" > "$marker"
changed
log "downloaded ${want} (${files} files, ${size})"
finish "\"model\":\"${want}\",\"files\":${files}"
