"""nemodrop/vllm_startup.py on real starts of vLLM 0.26.0 on a lent H100 (tests/data/
vllm-0.26.0-h100/runs.json says how each was made): the logs themselves, so no .vllm-venv."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from nemodrop import vllm_startup

ROOT = Path(__file__).resolve().parent.parent

REAL = ROOT / "tests" / "data" / "vllm-0.26.0-h100"
RUNS = json.loads((REAL / "runs.json").read_text())


def real(name: str) -> dict[str, Any]:
    return vllm_startup.parse((REAL / name).read_text())


@pytest.mark.parametrize("name", [n for n in RUNS if n.endswith(".log")])
def test_a_real_start_is_read_whole_and_adds_up_to_its_health(name: str) -> None:
    """Every phase of a real start is found (none missing, the last one reached), and the
    phases add up to the measured launch-to-/health but for what comes before vLLM's first
    line, which the report names: Python's imports (17-18 s on that host), plus the kit's
    1 s poll of /health."""
    parts = real(name)
    assert parts["missing"] == [] and parts["reached"] == vllm_startup.MARKS[-1][0]
    before_the_log = RUNS[name]["ready_s"] - sum(s for _, s in parts["timeline"])
    assert 15 <= before_the_log <= 21, (name, parts["timeline"])
    assert vllm_startup.NO_LAUNCH in vllm_startup.report(parts)


def test_real_starts_show_what_triton_s_cache_saves() -> None:
    """The measured before and after: the warm start that kept Triton's folder (the unit's
    environment) skipped the Mamba2 warm-up's autotuning; the one that lost it (TRITON_CACHE_DIR
    unset, as before the fix) autotuned the same 7 kernels again, as long as the cold start."""
    cold, kept, lost = real("cold.log"), real("warm-triton-kept.log"), real("warm-triton-lost.log")
    assert cold["compile_cache"] == "miss"
    assert kept["compile_cache"] == lost["compile_cache"] == "hit"
    assert cold["mamba_warmup_s"] == 60.0 and lost["mamba_warmup_s"] == 62.0
    assert kept["mamba_warmup_s"] == 1.0
    assert cold["autotuned"] == lost["autotuned"] == 7 and kept["autotuned"] == 0
    assert cold["autotune_s"] == pytest.approx(59.45) and lost["autotune_s"] == pytest.approx(60.82)
    assert kept["init_engine_s"] == 15.43 and lost["init_engine_s"] == 92.78
    # The model class's inspection: a subprocess on the first start, vLLM's modelinfos cache
    # (under VLLM_CACHE_ROOT, with the compile cache) after it.
    inspected = "API server: config, model class inspected (modelinfos)"
    assert dict(cold["timeline"])[inspected] == 17 and dict(kept["timeline"])[inspected] == 0
    report = vllm_startup.report(cold)
    assert re.search(r"of it: Triton autotuning \(7 kernels\) +59\.5 s$", report, re.M), report


def test_triton_s_folder_moved_with_the_volume_still_hits_under_new_flags() -> None:
    """New serve flags miss the compile cache (torch.compile again), but Triton's kernels are
    keyed by their source and arguments, not vLLM's flags: the moved folder still hit."""
    parts = real("new-flags-triton-kept.log")
    assert parts["compile_cache"] == "miss" and parts["compile_s"] == 13.02
    assert parts["mamba_warmup_s"] == 4.0 and parts["kv_cache_gib"] == 10.45


def test_systemd_s_launch_line_times_the_imports_before_vllm_s_first_line() -> None:
    """A journal read with logs.py (`--output short-iso`) has systemd's launch of the unit: the
    seconds to vLLM's first line become a phase, and the span runs from the launch."""
    log = (REAL / "warm-triton-kept.log").read_text().splitlines()
    first = next(line for line in log if vllm_startup.stamp(line) is not None)
    clock = re.search(r"\d\d-\d\d \d\d:\d\d:\d\d", first)
    assert clock is not None
    at = datetime.strptime(f"2026-{clock[0]}", "%Y-%m-%d %H:%M:%S") - timedelta(seconds=18)
    launch = at.strftime("%Y-%m-%dT%H:%M:%S+0000")
    journal = "\n".join([
        f"{launch} nemotron-prod systemd[1]: Started vllm.service - vLLM OpenAI-compatible server.",
        *log,
    ])  # fmt: skip
    parts = vllm_startup.parse(journal)
    assert parts["timeline"][0] == (vllm_startup.IMPORTS, 18.0)
    report = vllm_startup.report(parts)
    assert vllm_startup.NO_LAUNCH not in report
    total = sum(s for _, s in real("warm-triton-kept.log")["timeline"]) + 18
    assert re.search(rf"launch to the last line +{total:.0f} s$", report, re.M), report
