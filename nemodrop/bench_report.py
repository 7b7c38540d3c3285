"""bench.py's report: the table of each level, its plot, the result file (bench.py's own
layout, or `vllm bench serve`'s), and earlier runs compared side by side. No network: what a
run measured comes in as its level reports (bench.py), and goes out as text, PNG or JSON.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
from collections.abc import Sequence
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from nemodrop import bench_stats as stats
from nemodrop import target as target_mod

# The result file's format: bumped when its fields change meaning.
VERSION = "2.0"


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


# The latency summaries of a level, in the table's order.
LATENCIES = ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms")


def rows(reports: list[dict[str, Any]], keys: Sequence[str]) -> tuple[list[str], list[list[str]]]:
    """The columns and each level's cells: the level, ok/err, every latency as its `keys`
    (p50, p99, ...) in order, throughput; per replica and goodput when the run has them. One
    source for bench.py's table and the real run's job summary (scripts/ci/realrun/summary.py).
    A report without a field a column needs raises KeyError (or TypeError)."""
    open_loop = reports[0]["mode"] == "open"
    goodput = "goodput_requests_per_s" in reports[0]
    replicas = int(reports[0].get("replicas") or 1)
    columns = ["rate" if open_loop else "conc", "ok/err", "TTFT", "ITL", "TPOT", "E2E", "req/s"]
    columns += ["out tok/s", "tot tok/s"] + (["out tok/s/replica"] if replicas > 1 else [])
    columns += ["goodput", "SLO %"] if goodput else []
    # The prefix cache's share of the prompt tokens, when the server says (see bench.cached_pct).
    cached = any(r.get("prefix_cached_pct") is not None for r in reports)
    columns += ["cached %"] if cached else []
    cells = []
    for r in reports:
        level = r["request_rate"] if open_loop else r["concurrency"]
        row = [
            str(level),
            f"{r['requests'] - r['errors']}/{r['errors']}",
            *(" / ".join(_fmt(r[k].get(q)) for q in keys) for k in LATENCIES),
            _fmt(r["requests_per_s"]),
            _fmt(r["output_tokens_per_s"]),
            _fmt(r["total_tokens_per_s"]),
        ]
        if replicas > 1:
            row.append(_fmt(r["output_tokens_per_s_per_replica"]))
        if goodput:
            row += [_fmt(r["goodput_requests_per_s"]), _fmt(r["slo_attainment_pct"])]
        if cached:
            row.append(_fmt(r.get("prefix_cached_pct")))
        cells.append(row)
    return columns, cells


def _num(value: float | None) -> str:
    """A number for the terminal tables: as many decimals as its size needs, none from 100."""
    if value is None:
        return "-"
    return (
        f"{value:,.2f}"
        if abs(value) < 10
        else f"{value:,.1f}"
        if abs(value) < 100
        else (f"{value:,.0f}")
    )


def _level(report: dict[str, Any]) -> str:
    """The level's rate ("inf" stays a word) or concurrency."""
    rate = report["request_rate"]
    if report["mode"] == "open":
        return rate if isinstance(rate, str) else f"{rate:g}"
    return str(report["concurrency"])


def _offered(report: dict[str, Any]) -> float:
    """A level's place on its axis: the offered rate (inf last) or the concurrency."""
    value = report["request_rate"] if report["mode"] == "open" else report["concurrency"]
    return math.inf if value == "inf" else float(value)


def tables(reports: list[dict[str, Any]], percentiles: tuple[float, ...]) -> list[Table]:
    """bench.py's terminal report, readable at 80 columns without a number cut: latency (a row
    per level and metric, a column per percentile) and throughput (a row per level). Levels in
    the order of their rate or concurrency (a knee search runs them out of order)."""
    keys = [stats.pkey(p) for p in sorted(set(percentiles))]
    ordered = sorted(reports, key=_offered)
    level = "rate/s" if reports[0]["mode"] == "open" else "conc"
    latency = Table(
        title="bench: latency, ms", box=box.SIMPLE_HEAD, show_edge=False, collapse_padding=True
    )
    for column in (level, "", "mean", *keys):
        latency.add_column(column, justify="right", no_wrap=True)
    for r in ordered:
        for i, name in enumerate(("TTFT", "ITL", "TPOT", "E2E")):
            summary = r[LATENCIES[i]]
            latency.add_row(
                _level(r) if i == 0 else "",
                name,
                *(_num(summary.get(k)) for k in ("mean", *keys)),
                end_section=i == 3,
            )
    return [latency, _throughput(ordered, level)]


def _throughput(ordered: list[dict[str, Any]], level: str) -> Table:
    """A row per level: ok/err, requests/s, tokens/s; per replica, goodput and the prefix cache
    when the run has them. Headers on two lines, so that the numbers set the widths."""
    client = any(r["token_counts"] and "client" in r["token_counts"] for r in ordered)
    replicas = int(ordered[0].get("replicas") or 1)
    t = Table(
        title="bench: throughput, per second" + (f"; {replicas} replicas" if replicas > 1 else ""),
        caption="token counts from the stream: the server sent no usage" if client else None,
        box=box.SIMPLE_HEAD,
        show_edge=False,
        collapse_padding=True,
    )
    # (header, the report's field); the level and ok/err come first.
    fields = [
        ("req/s", "requests_per_s"),
        ("out\ntok/s", "output_tokens_per_s"),
        ("total\ntok/s", "total_tokens_per_s"),
    ]
    if replicas > 1:
        fields.append(("out tok/s\n/replica", "output_tokens_per_s_per_replica"))
    if "goodput_requests_per_s" in ordered[0]:
        fields += [
            ("goodput\nreq/s", "goodput_requests_per_s"),
            ("SLO\nmet %", "slo_attainment_pct"),
        ]
    if any(r.get("prefix_cached_pct") is not None for r in ordered):
        fields.append(("cached\n%", "prefix_cached_pct"))
    for header in (level, "ok/err", *(h for h, _ in fields)):
        t.add_column(header, justify="right", no_wrap=True)
    for r in ordered:
        ok = f"{r['requests'] - r['errors']}/{r['errors']}"
        t.add_row(_level(r), ok, *(_num(r.get(key)) for _, key in fields))
    return t


# What each kind of level is drawn against: one axis holds one kind, never both.
AXIS = {"closed": "concurrency (streams in flight)", "open": "offered request rate (requests/s)"}
PLOTTED = {"ttft_ms": "Time to first token", "tpot_ms": "Time per output token",
           "e2e_ms": "End-to-end latency"}  # fmt: skip


def _drawn(levels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The levels a line joins, in the order of the offered rate or concurrency (a knee search
    runs them out of order); a rate of inf has no place on the axis."""
    return sorted((r for r in levels if math.isfinite(_offered(r))), key=_offered)


def _level_axis(axis: Any, mode: str, xs: list[float]) -> None:
    """The x axis of one kind of level: concurrency doubles (log, its values as ticks)."""
    axis.set_xlabel(AXIS[mode])
    if mode == "closed" and xs:
        axis.set(xscale="log", xticks=xs)
        axis.set_xticklabels([f"{x:g}" for x in xs])
        axis.minorticks_off()


def figure(reports: list[dict[str, Any]], knee: dict[str, Any] | None = None) -> Any:
    """bench --plot: throughput; with an SLO, requests/s served and within it (goodput); a
    panel per latency the SLO bounds (TTFT and TPOT always). All against the offered rate or
    the concurrency, in order; the SLO's bound a line on its panel, the knee one on each."""
    plt = target_mod.pyplot()
    mode = reports[0]["mode"]
    drawn = _drawn(reports)
    xs = [_offered(r) for r in drawn]
    slo = reports[0].get("slo_ms") or {}
    metrics = ["ttft_ms", "tpot_ms"] + (["e2e_ms"] if "e2e" in slo else [])
    panels = 1 + bool(slo) + len(metrics)
    rows, cols = (2, 2) if panels == 4 else (1, panels)
    fig, grid = plt.subplots(rows, cols, figsize=(5.5 * cols, 4.2 * rows), squeeze=False)
    axes = list(grid.flat)[:panels]
    for spare in list(grid.flat)[panels:]:
        spare.remove()
    left = axes[0]
    left.plot(xs, [r["output_tokens_per_s"] for r in drawn], marker="o", label="output")
    if all(r["total_tokens_per_s"] is not None for r in drawn):
        left.plot(xs, [r["total_tokens_per_s"] for r in drawn], marker="o", label="total")
    left.set(ylabel="tokens/s", title="Throughput")
    if slo:
        served = axes[1]
        served.plot(xs, [r["requests_per_s"] for r in drawn], marker="o", label="served")
        good = [r["goodput_requests_per_s"] for r in drawn]
        served.plot(xs, good, "k--", marker="s", label="within the SLO (goodput)")
        served.set(ylabel="requests/s", title="Requests served, and within the SLO")
    keys = [k for k in reports[0]["ttft_ms"] if k.startswith("p")]
    for axis, metric in zip(axes[1 + bool(slo) :], metrics, strict=True):
        for q in dict.fromkeys((keys[0], keys[-1])) if keys else ():
            axis.plot(xs, [r[metric][q] for r in drawn], marker="o", label=q)
        bound = slo.get(metric.removesuffix("_ms"))
        if bound is not None:
            axis.axhline(bound, color="tab:red", linestyle="--", label=f"SLO {bound:g} ms")
        axis.set(ylabel="ms", title=PLOTTED[metric])
    held = (knee or {}).get("request_rate")
    for axis in axes:
        if held is not None:
            axis.axvline(held, color="tab:green", linestyle=":", label=f"knee {held:g}/s")
        _level_axis(axis, mode, xs)
        axis.legend(fontsize="small")
    footnote = len(drawn) < len(reports)
    if footnote:
        fig.text(0.01, 0.01, "levels at rate inf are in the table, not on the axis", fontsize=8)
    fig.tight_layout(rect=(0, 0.04 if footnote else 0, 1, 1))
    return fig


def plot(reports: list[dict[str, Any]], path: str, knee: dict[str, Any] | None = None) -> None:
    fig = figure(reports, knee)
    fig.savefig(path, dpi=120)
    target_mod.pyplot().close(fig)


# `vllm bench serve --save-result` names (vllm/benchmarks/serve.py: the result_json it writes,
# and process_one_metric's mean_/median_/std_/p<q>_ keys per metric; e2el for end-to-end).
_VLLM_METRICS = {"ttft_ms": "ttft", "tpot_ms": "tpot", "itl_ms": "itl", "e2e_ms": "e2el"}


def vllm_result(
    report: dict[str, Any], args: argparse.Namespace, model: str, started: datetime.datetime
) -> dict[str, Any]:
    """One level in the flat layout of `vllm bench serve --save-result`. A closed loop of N is
    what vLLM runs as request rate inf with max concurrency N."""
    open_loop = report["mode"] == "open"
    completed = report["requests"] - report["errors"]
    duration = report["duration_s"]
    mean_in, mean_out = report["mean_prompt_tokens"], report["mean_output_tokens"] or 0
    out: dict[str, Any] = {
        "date": started.strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": "openai-chat",
        "backend": "openai-chat",
        "label": None,
        "model_id": model,
        "tokenizer_id": model,
        "num_prompts": report["requests"],
        "request_rate": report["request_rate"] if open_loop else "inf",
        "burstiness": args.burstiness,
        "max_concurrency": report["concurrency"],
        "duration": duration,
        "completed": completed,
        "failed": report["errors"],
        "total_input_tokens": None if mean_in is None else round(mean_in * completed),
        "total_output_tokens": round(mean_out * completed),
        "request_throughput": report["requests_per_s"],
        "request_goodput": report.get("goodput_requests_per_s"),
        "output_throughput": report["output_tokens_per_s"],
        "total_token_throughput": report["total_tokens_per_s"],
    }
    for ours, theirs in _VLLM_METRICS.items():
        summary = report[ours]
        out[f"mean_{theirs}_ms"] = summary["mean"]
        out[f"median_{theirs}_ms"] = summary.get("p50")
        out[f"std_{theirs}_ms"] = summary["std"]
        for key, value in summary.items():
            if key.startswith("p"):
                out[f"{key}_{theirs}_ms"] = value
    return out


def compare(paths: list[str], plot_path: str | None) -> int:
    """Earlier runs side by side: one row per level of each, and a plot with a line per run."""
    runs = []
    for path in paths:
        try:
            with open(path) as f:
                data = json.load(f)
            levels = data["levels"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            print(f"error: {path}: not a bench.py result file (--json): {err}", file=sys.stderr)
            return 2
        runs.append((path.rsplit("/", 1)[-1].removesuffix(".json"), data, levels))
    out = Console(width=None if sys.stdout.isatty() else 160)
    for t in compare_tables(runs):
        out.print(t)
    if plot_path:
        compare_plot(runs, plot_path)
    return 0


def compare_tables(runs: list[tuple[str, dict[str, Any], list[dict[str, Any]]]]) -> list[Table]:
    """Runs side by side at 80 columns: a row per level and run, each level's runs together
    (concurrency levels first, then rates, in order); latency p50 and p99, then throughput."""
    rows = sorted(
        ((r.get("mode", "closed"), _offered({"mode": "closed", **r}), i, name, r)
         for i, (name, _, levels) in enumerate(runs) for r in levels),
        key=lambda row: row[:3],
    )  # fmt: skip
    latency = Table(title="bench: runs compared, latency in ms", box=box.SIMPLE_HEAD,
                    show_edge=False, collapse_padding=True)  # fmt: skip
    throughput = Table(title="bench: runs compared, per second", box=box.SIMPLE_HEAD,
                       show_edge=False, collapse_padding=True)  # fmt: skip
    for t in (latency, throughput):
        t.add_column("level", justify="right", no_wrap=True)
        t.add_column("run", overflow="fold")
    for metric in ("TTFT", "TPOT", "E2E"):
        for q in ("p50", "p99"):
            latency.add_column(f"{metric}\n{q}", justify="right", no_wrap=True)
    for header in ("ok/err", "req/s", "out\ntok/s", "goodput\nreq/s"):
        throughput.add_column(header, justify="right", no_wrap=True)
    previous = None
    for mode, _, _, name, r in rows:
        level = f"{'rate ' if mode == 'open' else 'conc '}{_level({'mode': mode, **r})}"
        shown = level if level != previous else ""
        previous = level
        latency.add_row(shown, name, *(_num(r[k].get(q)) for k in ("ttft_ms", "tpot_ms", "e2e_ms")
                                       for q in ("p50", "p99")))  # fmt: skip
        throughput.add_row(
            shown, name, f"{r['requests'] - r['errors']}/{r['errors']}",
            _num(r["requests_per_s"]), _num(r["output_tokens_per_s"]),
            _num(r.get("goodput_requests_per_s")),
        )  # fmt: skip
    return [latency, throughput]


def compare_figure(runs: list[tuple[str, dict[str, Any], list[dict[str, Any]]]]) -> Any:
    """Runs side by side: a row of panels (throughput, TTFT p50) per kind of level, so that a
    concurrency run and a rate run never share an axis; a line per run, levels in order."""
    plt = target_mod.pyplot()
    by_mode = {
        mode: [(name, [r for r in levels if r.get("mode", "closed") == mode])
               for name, _, levels in runs]
        for mode in AXIS
    }  # fmt: skip
    modes = [m for m in AXIS if any(levels for _, levels in by_mode[m])]
    fig, grid = plt.subplots(len(modes), 2, figsize=(11, 4 * len(modes)), squeeze=False)
    for (left, right), mode in zip(grid, modes, strict=True):
        ticks: set[float] = set()
        for i, (name, levels) in enumerate(by_mode[mode]):
            style = {"marker": "o", "label": name, "color": f"C{i}"}  # a run's color everywhere
            drawn = _drawn([{**r, "mode": mode} for r in levels])
            xs = [_offered(r) for r in drawn]
            ticks.update(xs)
            if drawn:
                left.plot(xs, [r["output_tokens_per_s"] for r in drawn], **style)
                right.plot(xs, [r["ttft_ms"].get("p50") for r in drawn], **style)
        left.set(ylabel="output tokens/s", title="Throughput")
        right.set(ylabel="ms", title="TTFT p50")
        for axis in (left, right):
            _level_axis(axis, mode, sorted(ticks))
            axis.legend(fontsize="small")
    fig.tight_layout()
    return fig


def compare_plot(runs: list[tuple[str, dict[str, Any], list[dict[str, Any]]]], path: str) -> None:
    fig = compare_figure(runs)
    fig.savefig(path, dpi=120)
    target_mod.pyplot().close(fig)


def settings_of(args: argparse.Namespace) -> dict[str, Any]:
    """Every setting of the run, for the result file; never the key."""
    hidden = {
        "api_key",
        "json_path",
        "plot",
        "save_requests",
        "no_progress",
        "compare",
        "usage_error",
    }
    out = {k: v for k, v in vars(args).items() if k not in hidden}
    if out.get("request_rate"):
        out["request_rate"] = ["inf" if math.isinf(r) else r for r in out["request_rate"]]
    return out


def write_results(
    args: argparse.Namespace,
    target: target_mod.Target,
    model: str,
    started: datetime.datetime,
    reports: list[dict[str, Any]],
    knee: dict[str, Any],
) -> None:
    """--json: our self-describing file, or vLLM's layout (one line per level)."""
    if args.format == "vllm":
        with open(args.json_path, "w") as f:
            for report in reports:
                f.write(json.dumps(vllm_result(report, args, model, started)) + "\n")
    else:
        result = {
            "tool": "nemotron-droplet nemodrop bench",
            "version": VERSION,
            "date": started.isoformat(timespec="seconds"),
            "endpoint": target.endpoint,
            "model": model,
            "seed": args.seed,
            "settings": settings_of(args),
            "levels": reports,
        }
        if args.find_knee:
            result["knee"] = {**knee, "slo_ms": args.slo, "slo_target_pct": args.slo_target}
        with open(args.json_path, "w") as f:
            json.dump(result, f, indent=2)
