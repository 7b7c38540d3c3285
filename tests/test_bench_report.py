"""bench.py's report (nemodrop/bench_report.py): vLLM's `bench serve` field names in the result
file, earlier runs compared side by side, the plots (open loop with goodput, throughput and TTFT,
levels by offered rate with the knee and the SLO, never concurrency and rate on one axis), the
tables at 80 columns without eliding a number, the cached column only when the server says."""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
from test_tools import (
    KEY,
    bench,
    fake_server,
    run_tool,
)


def test_bench_writes_vllm_bench_serve_field_names(tmp_path: Path) -> None:
    out = tmp_path / "vllm.jsonl"
    with fake_server("--ttft", "0.02", "--itl", "0.002") as base:
        run_tool(
            "bench", "--endpoint", base, "--api-key", KEY, "--model", "nemotron",
            "--no-progress", "--request-rate", "20,inf", "--requests", "6", "--max-tokens", "4",
            "--input-tokens", "8", "--slo", "ttft=500", "--format", "vllm", "--json", str(out),
        )  # fmt: skip
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [x["request_rate"] for x in lines] == [20.0, "inf"]
    first = lines[0]
    for key in (
        "date", "backend", "model_id", "num_prompts", "burstiness", "max_concurrency", "duration",
        "completed", "failed", "total_input_tokens", "total_output_tokens",
        "request_throughput", "request_goodput", "output_throughput", "total_token_throughput",
        "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
        "median_itl_ms", "p99_e2el_ms",
    ):  # fmt: skip
        assert key in first, key
    assert first["completed"] == 6 and first["total_output_tokens"] == 24
    assert first["num_prompts"] == 6 and first["model_id"] == "nemotron"
    assert KEY not in out.read_text()


def test_bench_compares_earlier_runs_side_by_side(tmp_path: Path) -> None:
    runs = []
    for name, ttft in (("before", "0.08"), ("after", "0.02")):
        path = tmp_path / f"{name}.json"
        with fake_server("--ttft", ttft, "--itl", "0.002") as base:
            proc = run_tool(
                "bench", "--endpoint", base, "--api-key", KEY, "--model", "nemotron",
                "--no-progress", "--concurrency", "1,2", "--requests", "4", "--max-tokens", "3",
                "--input-tokens", "8", "--json", str(path),
            )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        runs.append(str(path))
    png = tmp_path / "compare.png"
    proc = run_tool("bench", "--compare", *runs, "--plot", str(png))
    assert proc.returncode == 0, proc.stderr
    assert "before" in proc.stdout and "after" in proc.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    broken = tmp_path / "broken.json"
    broken.write_text("[]")
    bad = run_tool("bench", "--compare", str(broken))
    assert bad.returncode == 2 and "not a bench.py result file" in bad.stderr


def test_bench_plots_an_open_loop_with_goodput(tmp_path: Path) -> None:
    png = tmp_path / "open.png"
    with fake_server("--ttft", "0.01", "--itl", "0.001") as base:
        bench(
            base, tmp_path, request_rate="20,40", requests=6, max_tokens=4, input_tokens=8,
            slo="ttft=100", plot=str(png),
        )  # fmt: skip
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_plots_throughput_and_ttft(tmp_path: Path) -> None:
    png = tmp_path / "bench.png"
    with fake_server("--ttft", "0.01", "--itl", "0.001") as base:
        bench(
            base,
            tmp_path,
            concurrency="1,2",
            requests=2,
            max_tokens=4,
            input_tokens=8,
            plot=str(png),
        )
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_shows_a_cached_column_only_when_the_server_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    report = importlib.import_module("nemodrop.bench_report")
    with fake_server("--ttft", "0.01", "--itl", "0.002") as base:
        plain = bench(base, tmp_path, concurrency=1, requests=2, max_tokens=2)
    with fake_server("--prefix-cache-blocks", "100") as base:
        cached = bench(base, tmp_path, concurrency=1, requests=2, max_tokens=2, shared_prefix=32)
    assert plain[0]["prefix_cached_pct"] is None
    assert "cached %" not in report.rows(plain, ["p50"])[0]
    columns, cells = report.rows(cached, ["p50"])
    assert columns[-1] == "cached %" and float(cells[0][-1]) > 0


def heavy_level(level: float, mode: str = "open") -> dict[str, Any]:
    """A level report at its widest: seconds-long latencies, five percentiles, an SLO, the
    prefix cache, replicas."""
    scale = level / 10
    summary = {k: v * scale for k, v in (("mean", 1516.4), ("std", 80.0), ("min", 151.2),
               ("max", 98765.4), ("p50", 1512.3), ("p90", 12345.6), ("p95", 23456.7),
               ("p99", 54321.9), ("p99.9", 98765.4))}  # fmt: skip
    return {
        "mode": mode, "concurrency": None if mode == "open" else int(level),
        "request_rate": level if mode == "open" else None, "achieved_request_rate": level * 0.98,
        "requests": 1000, "errors": 12, "errors_by_kind": {"timeout": 12}, "excluded_requests": 0,
        "aborted": None, "duration_s": 100.0, "ttft_ms": summary,
        "itl_ms": {k: v / 100 for k, v in summary.items()},
        "tpot_ms": {k: v / 90 for k, v in summary.items()},
        "e2e_ms": {k: v * 10 for k, v in summary.items()},
        "requests_per_s": 9.87 * scale, "output_tokens_per_s": 12345.6 * scale,
        "total_tokens_per_s": 123456.7 * scale, "mean_prompt_tokens": 512.0,
        "mean_output_tokens": 128.0, "prefix_cached_pct": 87.5, "token_counts": "server",
        "slo_ms": {"ttft": 500.0, "tpot": 50.0}, "goodput_requests_per_s": 8.1 * scale,
        "slo_attainment_pct": 91.2, "replicas": 3,
        "output_tokens_per_s_per_replica": 4115.2 * scale,
    }  # fmt: skip


def render(renderables: list[Any], width: int) -> str:
    from rich.console import Console  # noqa: PLC0415

    console = Console(width=width, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    for r in renderables:
        console.print(r)
    return console.export_text()


def test_the_bench_tables_fit_80_columns_without_eliding_a_number(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    report = importlib.import_module("nemodrop.bench_report")
    levels = [heavy_level(40), {**heavy_level(40), "request_rate": "inf"}, heavy_level(10),
              heavy_level(20)]  # fmt: skip
    text = render(report.tables(levels, (50, 90, 95, 99, 99.9)), width=80)
    assert "…" not in text, text
    assert max(len(line) for line in text.splitlines()) <= 80, text
    # Every number whole: the p99.9 of E2E at 40/s, the widest cell, and the throughput.
    for number in ("3,950,616", "494", "49,382", "87.5", "91.2"):
        assert number in text, (number, text)
    # Levels in the order of the offered rate, each with its four latencies.
    rows = [
        line.split()[0]
        for line in text.splitlines()
        if line.split()[:1] in (["10"], ["20"], ["40"], ["inf"])
    ]
    assert rows == ["10", "20", "40", "inf"] * 2, text
    assert text.count("TTFT") == 4 and text.count("E2E") == 4
    # Runs compared: each level's runs together, concurrency and rate levels apart.
    closed = [heavy_level(c, mode="closed") for c in (8, 1)]
    runs = [("before", {}, closed), ("after-change", {}, [*closed, heavy_level(20)])]
    text = render(report.compare_tables(runs), width=80)
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80, text
    assert "1,086,438" in text and "24,691" in text
    levels = [
        line.split()[:2] for line in text.splitlines() if line.split()[:1] in (["conc"], ["rate"])
    ]
    assert levels == [["conc", "1"], ["conc", "8"], ["rate", "20"]] * 2, text


def lines_of(axis: Any) -> dict[str, tuple[list[float], list[float]]]:
    """label -> (x data, y data) of each line an axis holds."""
    return {
        str(line.get_label()): ([float(x) for x in line.get_xdata()],
                                [float(y) for y in line.get_ydata()])
        for line in axis.get_lines()
    }  # fmt: skip


def test_the_plot_orders_levels_by_offered_rate_and_marks_the_knee_and_the_slo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Levels as a knee search runs them (10, 20, 40, then bisecting back), one at rate inf."""
    monkeypatch.setenv("MPLCONFIGDIR", str(tmp_path / "mpl"))
    report = importlib.import_module("nemodrop.bench_report")
    levels = [heavy_level(rate) for rate in (10, 20, 40, 30, 25)]
    levels.append({**heavy_level(50), "request_rate": "inf"})
    fig = report.figure(levels, {"request_rate": 25, "first_failing_rate": 30})
    panels = {axis.get_title(): axis for axis in fig.axes}
    throughput, served = panels["Throughput"], panels["Requests served, and within the SLO"]
    ttft, tpot = panels["Time to first token"], panels["Time per output token"]
    xs, _ = lines_of(throughput)["output"]
    assert xs == [10, 20, 25, 30, 40], "the offered rates, in order; inf left off the axis"
    assert lines_of(served)["within the SLO (goodput)"][0] == xs
    for axis in (throughput, served, ttft, tpot):
        assert axis.get_xlabel() == "offered request rate (requests/s)"
        assert lines_of(axis)["knee 25/s"][0] == [25, 25], "the knee: a vertical line"
    assert lines_of(ttft)["SLO 500 ms"][1] == [500, 500], "the TTFT bound: a horizontal line"
    assert lines_of(tpot)["SLO 50 ms"][1] == [50, 50]
    assert lines_of(ttft)["p99.9"][1] == sorted(lines_of(ttft)["p99.9"][1])
    png = tmp_path / "knee.png"
    fig.savefig(png, dpi=120)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_comparison_never_puts_concurrency_and_rate_on_one_axis(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MPLCONFIGDIR", str(tmp_path / "mpl"))
    report = importlib.import_module("nemodrop.bench_report")
    closed = [heavy_level(c, mode="closed") for c in (8, 1, 32)]
    rated = [heavy_level(r) for r in (20, 5)]
    fig = report.compare_figure([("conc", {}, closed), ("rate", {}, rated), ("both", {}, [
        *closed, *rated])])  # fmt: skip
    by_label: dict[str, list[set[str]]] = {}
    for axis in fig.axes:
        by_label.setdefault(axis.get_xlabel(), []).append(set(lines_of(axis)))
        xs = {x for line_xs, _ in lines_of(axis).values() for x in line_xs}
        if axis.get_xlabel().startswith("concurrency"):
            assert xs == {1, 8, 32}, xs
        else:
            assert xs == {5, 20}, xs
        for x, _ in lines_of(axis).values():
            assert x == sorted(x)
    assert by_label == {
        "concurrency (streams in flight)": [{"conc", "both"}] * 2,
        "offered request rate (requests/s)": [{"rate", "both"}] * 2,
    }
