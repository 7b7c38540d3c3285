#!/bin/bash
# gpu_mamba_cache.sh (device, after the kit's calls 1-3: ../shared/gpu/README.md): where the
# Mamba2 SSD warm-up's Triton kernels and autotune results go, and which start finds them.
#
# Hypothesis (docs/cache.md, "The Mamba2 warm-up"): with TRITON_CACHE_DIR unset, torch's Inductor
# sets it mid-process to VLLM_CACHE_ROOT/.../inductor_cache/triton/0 only when it compiles (a
# cold start), not when vLLM loads its compile cache (a warm start), so the warm start looks in
# ~/.triton/cache, misses, compiles and autotunes again (76-80 s), and only the start after it is
# fast (1-3 s). Set explicitly (what the service unit now does), every start shares one folder.
#
# usage: gpu_mamba_cache.sh MODEL_DIR LABEL MODE [extra `vllm serve` args...]
#   MODE unset:   three starts, caches cleared first, TRITON_CACHE_DIR unset (before the fix)
#   MODE before:  the same, two starts (cold, then warm): the before on the project's flags
#   MODE set:     two starts, caches cleared first, the unit's compile_cache_env() with its
#                 folders under /tmp/vol (/tmp/vol stands for the cache Volume), then a third
#                 with /tmp/vol moved to /tmp/vol2 (a Volume mounted elsewhere)
#   MODE study:   before and after on one machine in one call: caches cleared, the unit's
#                 environment; a cold start, a warm start (the fix), then a warm start with
#                 TRITON_CACHE_DIR unset (the compile cache hits, so Inductor leaves the variable
#                 alone and Triton looks in ~/.triton/cache: a warm start before the fix)
#   MODE pair:    caches cleared, the unit's environment: a cold start and a warm one (the
#                 after, e.g. with the project's own flags)
#   MODE split:   with the fix's folders warm, one start without the Triton cache, one without
#                 the compile cache: which of the two the warm-up needs
# e.g. bash tests/support/gpu_mamba_cache.sh /tmp/md_tiny tiny unset --max-model-len 4096 \
#        --gpu-memory-utilization 0.5
# Each start is the kit's serve_bench.sh (BENCH=no: /health, the warm-up line, one chat request,
# stop); after each, the Triton kernels and *.autotune.json files are counted where they lie.
# Writes to $OUT: summary.txt (appended), serve_LABEL-N.log, bench_LABEL-N.tgz, caches_LABEL.txt
# (at most 8 files: what `run` brings back).
set -u
MD=$1; LABEL=$2; MODE=$3; shift 3
KIT=${KIT:-/tmp/vc}
O=${OUT:-/tmp/out}; mkdir -p "$O"
MARK=/tmp/gpu_mamba_cache.mark   # not under $OUT: every file there counts against the 8
CACHES=$O/caches_$LABEL.txt

# census TITLE: every folder that holds Triton kernels, with its kernels and autotune results.
census() {
  {
    echo "== $1"
    for d in ~/.triton/cache ~/.cache/vllm /tmp/torchinductor_root /tmp/vol /tmp/vol2; do
      [ -d "$d" ] || continue
      find "$d" -name '*.autotune.json' -printf '%h\n' 2>/dev/null | sort | uniq -c | sed "s|^|autotune  |"
      find "$d" -name '*.cubin' -printf '%h\n' 2>/dev/null | sed 's|/[^/]*$||' | sort | uniq -c | sed "s|^|cubins    |"
      du -sh "$d" 2>/dev/null | sed "s|^|size      |"
    done
    find / -xdev -name '_chunk_scan_fwd_kernel.autotune.json' -newer "$MARK" 2>/dev/null | sed "s|^|new scan  |"
  } >> "$CACHES"
}

# start N: one start, its warm-up's seconds into summary.txt (serve_bench.sh), the census after.
start() {
  local n=$1; shift
  touch "$MARK"
  TRITON_PRINT_AUTOTUNING=1 bash "$KIT/serve_bench.sh" "$MD" "$LABEL-$n" no "$@"
  grep -c "Triton autotuning for function" "$O/serve_$LABEL-$n.log" \
    | sed "s|^|[$LABEL-$n] autotuned kernels (benchmarked now): |" | tee -a "$O/summary.txt"
  census "after start $n ($MODE) env TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-unset}"
}

clear_caches() { rm -rf ~/.triton/cache ~/.cache/vllm /tmp/torchinductor_* /tmp/vol /tmp/vol2; }

case $MODE in
  unset|before)
    clear_caches
    unset TRITON_CACHE_DIR VLLM_CACHE_ROOT TRITON_CACHE_AUTOTUNING
    starts="1 2 3"; [ "$MODE" = before ] && starts="1 2"
    for n in $starts; do start "$n" "$@"; done ;;
  set)
    clear_caches
    # components/host/vllm_service.py compile_cache_env(), with /tmp/vol for the Volume
    export TRITON_CACHE_DIR=/tmp/vol/triton VLLM_CACHE_ROOT=/tmp/vol/vllm TRITON_CACHE_AUTOTUNING=1
    start 1 "$@"; start 2 "$@"
    mv /tmp/vol /tmp/vol2
    export TRITON_CACHE_DIR=/tmp/vol2/triton VLLM_CACHE_ROOT=/tmp/vol2/vllm
    start 3 "$@" ;;
  study)
    clear_caches
    export TRITON_CACHE_DIR=/tmp/vol/triton VLLM_CACHE_ROOT=/tmp/vol/vllm TRITON_CACHE_AUTOTUNING=1
    start 1 "$@"; start 2 "$@"
    unset TRITON_CACHE_DIR
    start 3 "$@" ;;
  pair)
    clear_caches
    export TRITON_CACHE_DIR=/tmp/vol/triton VLLM_CACHE_ROOT=/tmp/vol/vllm TRITON_CACHE_AUTOTUNING=1
    start 1 "$@"; start 2 "$@" ;;
  split)
    export TRITON_CACHE_DIR=/tmp/vol2/triton VLLM_CACHE_ROOT=/tmp/vol2/vllm
    mv /tmp/vol2/triton /tmp/triton.kept; start 4 "$@"
    rm -rf /tmp/vol2/triton; mv /tmp/triton.kept /tmp/vol2/triton
    rm -rf /tmp/vol2/vllm; start 5 "$@" ;;
  *) echo "gpu_mamba_cache: MODE is unset, before, set, study, pair or split" >&2; exit 2 ;;
esac
