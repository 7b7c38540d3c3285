"""`summary`: the job summary (smoke lines, bench table, the bootstrap as a text chart, the
cost) from whatever files the run left; a missing one is named with the step that writes it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .deploy import KUBE_NO_AUTODOWN
from .plan import cents_up

# The outputs the summary reads; nothing else is looked at.
SUMMARY_OUTPUTS = (
    "size",
    "region",
    "hourlyPriceUsd",
    "servedModelName",
    "bootstrapTimeline",
    "autodown",
)


@dataclass(frozen=True)
class Inputs:
    outputs: Path
    smoke: Path
    bench: Path
    timeline_png: Path
    plan: Path
    cleanup: Path
    started: int | None
    ended: int | None
    price: float | None
    cap: float | None


# Which step writes each file, for the line that says why one is missing.
WRITTEN_BY = {
    "outputs": "the outputs step (after a successful `pulumi up`)",
    "smoke": "the smoke step (after a successful `pulumi up`)",
    "bench": "the bench step (after a successful `pulumi up`)",
    "timeline_png": "the timeline step (from the outputs)",
    "plan": "the plan step",
    "cleanup": "the destroy step",
}


def missing(what: str, path: Path, detail: str = "") -> str:
    why = detail or f"it was not written: {WRITTEN_BY[what]} did not run or failed"
    return f"_Missing: `{path}`: {why}._"


def read_json(path: Path) -> tuple[Any, str]:
    """The file's JSON, or None and why not."""
    try:
        return json.loads(path.read_text()), ""
    except FileNotFoundError:
        return None, ""
    except OSError as err:
        return None, f"unreadable ({err.strerror})"
    except ValueError as err:
        return None, f"not JSON ({err})"


# The latencies the summary shows of each level (bench.py reports these by default).
BENCH_PERCENTILES = ("p50", "p99")


def markdown_row(cells: list[str]) -> str:
    return f"| {' | '.join(cells)} |"


def bench_section(path: Path) -> list[str]:
    """bench.py's table, as Markdown: the same rows (bench_report.rows), p50 / p99."""
    data, problem = read_json(path)
    if data is None:
        return [missing("bench", path, problem)]
    levels = data.get("levels") if isinstance(data, dict) else None
    if not isinstance(levels, list) or not levels:
        return [missing("bench", path, "not a bench.py result file (no levels)")]
    from nemodrop import bench_report  # noqa: PLC0415 (the tools' dependencies, only needed here)

    try:
        columns, cells = bench_report.rows(levels, BENCH_PERCENTILES)
    except KeyError as err:
        return [missing("bench", path, f"not a bench.py result file (a level has no {err})")]
    except (TypeError, AttributeError, ValueError) as err:
        return [missing("bench", path, f"not a bench.py result file (a level: {err})")]
    settings = data.get("settings") or {}
    lines = [
        f"Model `{data.get('model', '?')}`; per level {settings.get('requests', '?')} requests of "
        f"about {settings.get('input_tokens', '?')} prompt and "
        f"{settings.get('max_tokens') or 128} output tokens. Latency in ms, p50 / p99; "
        "throughput per second.",
        "",
        markdown_row(columns),
        markdown_row(["---:"] * len(columns)),
        *(markdown_row(row) for row in cells),
    ]
    notes = []
    for r, row in zip(levels, cells, strict=True):
        label = f"{columns[0]} {row[0]}"
        if r.get("aborted"):
            notes.append(f"{label} stopped: {r['aborted']}")
        if r.get("errors_by_kind"):
            notes.append(f"{label} errors: {r['errors_by_kind']}")
    return lines + [f"\n{n}" for n in notes]


def smoke_section(path: Path) -> tuple[list[str], str]:
    try:
        text = path.read_text(errors="replace").strip()
    except FileNotFoundError:
        return [missing("smoke", path)], "not run"
    except OSError as err:
        return [missing("smoke", path, f"unreadable ({err.strerror})")], "unknown"
    if not text:
        return [missing("smoke", path, "empty: smoke.py printed nothing")], "unknown"
    last = text.splitlines()[-1]
    verdict = "passed" if last == "all checks passed" else "failed"
    return ["```text", text, "```"], verdict


GANTT_WIDTH = 40


def timeline_section(outputs: Any, png: Path) -> list[str]:
    from nemodrop import timeline  # noqa: PLC0415 (the tools' dependencies, only needed here)

    entries = outputs.get("bootstrapTimeline") if isinstance(outputs, dict) else None
    if not isinstance(entries, dict):
        return ["_Missing: no `bootstrapTimeline` in the outputs (see above)._"]
    timed, untimed = timeline.spans(entries)
    if not timed:
        return ["_No phase recorded its times._"]
    origin = min(s.start for s in timed)
    wall = max(s.end for s in timed) - origin or 1.0
    critical = {s.phase for s in timeline.critical_path(timed)}
    lines = [
        f"The bootstrap took {wall:,.0f} s from the first phase's start to the last one's end; "
        "█ marks the critical path (shortening anything else would not bring the endpoint "
        "sooner).",
        "",
        "```text",
        f"{'phase':<12} {'start s':>8} {'seconds':>8}  timeline",
    ]
    for s in timed:
        at = int((s.start - origin) / wall * GANTT_WIDTH)
        length = max(1, round(s.seconds / wall * GANTT_WIDTH))
        bar = ("█" if s.phase in critical else "▒") * length
        lines.append(f"{s.phase:<12} {s.start - origin:>8,.0f} {s.seconds:>8,.1f}  {' ' * at}{bar}")
    # The downloads against the link, and the disks preflight saw: timeline.py's own lines.
    lines += [
        "",
        *timeline.budget(entries),
        *(["", *seen] if (seen := timeline.disks(entries)) else []),
    ]
    lines.append("```")
    if untimed:
        lines += ["", f"No times recorded for: {', '.join(untimed)}."]
    picture = (
        f"The same as a picture: `{png.name}` in this run's artifact"
        if png.exists()
        else missing("timeline_png", png)
    )
    lines += [
        "",
        picture
        + " (a job summary cannot show it: GitHub strips `data:` images from Markdown, and an "
        "artifact needs a signed-in download, not an image link).",
    ]
    return lines


def hourly_price(outputs: Any, fallback: float | None) -> tuple[float | None, str]:
    live = outputs.get("hourlyPriceUsd") if isinstance(outputs, dict) else None
    if isinstance(live, int | float) and live > 0:
        return float(live), "the live price the stack exported (`hourlyPriceUsd`)"
    if fallback is not None:
        return fallback, (
            "the size's list price (components/spec/catalog.py): no live price exported"
        )
    return None, ""


def cost_section(inputs: Inputs, outputs: Any, cleaned: Any, kube: bool = False) -> list[str]:
    price, source = hourly_price(outputs, inputs.price)
    what = "the Droplet"
    if kube:
        # The stack's hourlyPriceUsd leaves the Volumes out (docs/outputs.md); the plan's bound
        # counts every part, so it is the price of the run.
        price, what = inputs.price, "the cluster"
        source = (
            "the plan's bound at list prices (GPU node, CPU pool, Load Balancer, Volumes: "
            "plan.json hourly_parts)"
        )
    cap = f" of the ${inputs.cap:.2f} cap" if inputs.cap else ""
    found = cleaned.get("found") if isinstance(cleaned, dict) else None
    if inputs.started is None or found is False:
        return ["$0.00: nothing was created (`pulumi up` never started or no stack was made)."]
    if price is None:
        return ["Unknown: no price (the plan did not run and the stack exported none)."]
    ended, note = inputs.ended, ""
    if ended is None:
        ended = int(time.time())
        note = (
            f" **The destroy step did not report an end: {what} may still exist and bill** "
            "(see Destroy below); this is the cost up to now."
        )
    seconds = max(ended - inputs.started, 0)
    per_second = cents_up(max(price * seconds / 3600, price / 60, 0.01))
    by_hour = cents_up(price * max(math.ceil(seconds / 3600), 1))
    return [
        f"**About ${per_second:.2f}**{cap}: {seconds // 60} min {seconds % 60} s from the start "
        f"of `pulumi up` to the end of `pulumi destroy` ({what} exists only inside it) at "
        f"${price:g}/hour, {source}, per second.{note}",
        "",
        "DigitalOcean bills Droplets per second since 1 January 2026, with a minimum of 60 "
        "seconds or $0.01 (its Droplet pricing page says so for CPU Droplets; its GPU section "
        f"was not readable from here). Billed by the started hour instead: ${by_hour:.2f}.",
    ]


def destroy_section(path: Path, cleaned: Any, problem: str, cluster: str = "") -> list[str]:
    if not isinstance(cleaned, dict):
        where = (
            f"Kubernetes cluster `{cluster}`" if cluster else "Droplets tagged `nemotron-droplet`"
        )
        return [
            missing("cleanup", path, problem)
            + " **Check that nothing is left**: `pulumi stack ls`, and the DigitalOcean console "
            f"({where})."
        ]
    return [str(cleaned.get("message") or "no message")]


def autodown_line(outputs: Any, kube: bool = False) -> str:
    if kube:
        return f"Autodown: none: {KUBE_NO_AUTODOWN}."
    autodown = outputs.get("autodown") if isinstance(outputs, dict) else None
    if not isinstance(autodown, dict):
        return "Autodown: unknown (no outputs)."
    mode = autodown.get("mode")
    line = (
        f"Autodown: `{mode}`, idleMinutes {autodown.get('idleMinutes')}, "
        f"maxHours {autodown.get('maxHours')}"
    )
    if mode == "dry-run":
        line += (
            ": a dry run (no AUTODOWN_TOKEN secret), so had this run's destroy failed, only the "
            "lease workflow would have deleted the Droplet"
        )
    return line + "."


def summary(inputs: Inputs) -> str:
    outputs, outputs_problem = read_json(inputs.outputs)
    plan, _ = read_json(inputs.plan)
    cleaned, cleanup_problem = read_json(inputs.cleanup)
    if isinstance(outputs, dict):  # only the keys the summary shows
        outputs = {k: outputs[k] for k in SUMMARY_OUTPUTS if k in outputs}
    stack = plan.get("stack") if isinstance(plan, dict) else None
    kube = isinstance(plan, dict) and plan.get("platform") == "kubernetes"
    cluster = str(plan.get("cluster") or "") if kube else ""
    size = (outputs or {}).get("size") or (plan.get("size") if isinstance(plan, dict) else None)
    smoke_lines, smoke_verdict = smoke_section(inputs.smoke)
    head = [
        f"## Real run: `{stack or 'no plan'}`",
        "",
        f"Size `{size or '?'}` in `{(outputs or {}).get('region') or '?'}`, model "
        f"`{(outputs or {}).get('servedModelName') or '?'}`; smoke: {smoke_verdict}. "
        + autodown_line(outputs, kube),
    ]
    if outputs is None:
        head += ["", missing("outputs", inputs.outputs, outputs_problem)]
    if plan is None:
        head += ["", missing("plan", inputs.plan)]
    body = [
        *head,
        "",
        "### Cost",
        "",
        *cost_section(inputs, outputs, cleaned, kube),
        "",
        "### Destroy",
        "",
        *destroy_section(inputs.cleanup, cleaned, cleanup_problem, cluster),
        "",
        "### Smoke (`smoke.py --strict`)",
        "",
        *smoke_lines,
        "",
        "### Bench (`bench.py`, short)",
        "",
        *bench_section(inputs.bench),
        "",
        "### Bootstrap timeline",
        "",
        *(
            ["_None on Kubernetes: the cluster's pods have no bootstrap phases._"]
            if kube
            else timeline_section(outputs, inputs.timeline_png)
            if outputs is not None
            else ["_No outputs, so no timeline (see above)._"]
        ),
        "",
        "The artifact keeps the JSON (plan, outputs without secrets, bench, cleanup), the smoke "
        "and timeline text and the timeline picture.",
    ]
    return "\n".join(body) + "\n"


def epoch(text: str | None, what: str) -> int | None:
    """An epoch from a step output; empty means the step did not run."""
    if not text:
        return None
    try:
        return int(float(text))
    except ValueError:
        raise SystemExit(f"error: {what} {text!r}: accepted: epoch seconds, or empty") from None


def dollars(text: str | None, what: str) -> float | None:
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise SystemExit(f"error: {what} {text!r}: accepted: a number of dollars") from None
    return value if math.isfinite(value) and value > 0 else None


def cmd_summary(args: argparse.Namespace) -> int:
    base: Path = args.out_dir

    def path(given: str | None, name: str) -> Path:
        return Path(given) if given else base / name

    inputs = Inputs(
        outputs=path(args.outputs, "outputs.json"),
        smoke=path(args.smoke, "smoke.txt"),
        bench=path(args.bench, "bench.json"),
        timeline_png=path(args.timeline_png, "timeline.png"),
        plan=path(args.plan, "plan.json"),
        cleanup=path(args.cleanup, "cleanup.json"),
        started=epoch(args.started, "--started"),
        ended=epoch(args.ended, "--ended"),
        price=dollars(args.price, "--price"),
        cap=dollars(args.cap, "--cap"),
    )
    text = summary(inputs)
    target = os.environ.get("GITHUB_STEP_SUMMARY")
    if target:
        with open(target, "a") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0
