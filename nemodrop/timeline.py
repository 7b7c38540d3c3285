"""Where the bootstrap's minutes went: each phase on a time line, and the critical path.

    nemodrop timeline --stack dev --png timeline.png
    nemodrop timeline --outputs outputs.json         # `pulumi stack output --json`
    nemodrop logs --stack dev -n 3000 --no-follow > vllm.log
    nemodrop timeline --stack dev --journal vllm.log # and the service phase's parts

Reads the stack's `bootstrapTimeline` output (each phase's start and end on the Droplet's clock
and the phases it waited for). The critical path runs back from the phase that ended last,
each time through the phase it waited for that ended last: shortening anything else would not
bring the endpoint sooner. Each phase's share is of the whole bootstrap's wall time. A phase
that did not run on the last `pulumi up` keeps the times of the run that last ran it.

With `--journal` (vLLM's journal, as logs.py prints it) it also splits vLLM's start into what
its own log lines time: weights, model load, torch.compile and whether its cache hit, the
profiling run and the Mamba2 kernels' warm-up in it, CUDA graph capture, the engine's init, and
every phase from launch to serving by the log's own clock, naming a line it lacks
(vllm_startup.py).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Any

from nemodrop import cli, vllm_startup
from nemodrop import target as target_mod


@dataclass(frozen=True)
class Span:
    phase: str
    start: float
    end: float
    after: tuple[str, ...]

    @property
    def seconds(self) -> float:
        return self.end - self.start


def spans(timeline: dict[str, Any]) -> tuple[list[Span], list[str]]:
    """The phases with recorded times, in start order, and the names of those without."""
    timed, untimed = [], []
    for phase, entry in timeline.items():
        start, end = entry.get("start"), entry.get("end")
        if start is None or end is None:
            untimed.append(phase)
            continue
        timed.append(Span(phase, float(start), float(end), tuple(entry.get("after") or ())))
    timed.sort(key=lambda s: (s.start, s.end))
    return timed, untimed


def critical_path(timed: list[Span]) -> list[Span]:
    """From the phase that ended last, back through the dependency that ended last."""
    if not timed:
        return []
    by_name = {s.phase: s for s in timed}
    path = [max(timed, key=lambda s: s.end)]
    while True:
        waited = [by_name[a] for a in path[-1].after if a in by_name]
        if not waited:
            break
        path.append(max(waited, key=lambda s: s.end))
    return list(reversed(path))


def report(timed: list[Span], untimed: list[str]) -> str:
    if not timed:
        return "no phase has recorded times yet: pulumi up with this version first"
    origin = min(s.start for s in timed)
    wall = max(s.end for s in timed) - origin
    path = critical_path(timed)
    on_path = {s.phase for s in path}
    lines = [f"bootstrap: {wall:,.0f} s from the first phase's start to the last one's end", ""]
    lines.append(f"{'phase':<12} {'start':>8} {'seconds':>9}  critical")
    for s in timed:
        mark = "*" if s.phase in on_path else ""
        lines.append(f"{s.phase:<12} {s.start - origin:>8,.0f} {s.seconds:>9,.1f}  {mark}")
    lines += ["", "critical path (share of the wall time):"]
    for s in path:
        share = 100 * s.seconds / wall if wall else 0.0
        lines.append(f"  {s.phase:<12} {s.seconds:>9,.1f} s  {share:5.1f}%")
    waiting = wall - sum(s.seconds for s in path)
    if wall and waiting > 0.5:
        lines.append(f"  {'(between)':<12} {waiting:>9,.1f} s  {100 * waiting / wall:5.1f}%")
    if untimed:
        lines.append(f"\nno times recorded for: {', '.join(untimed)} (run by an earlier version)")
    return "\n".join(lines)


# The floor of a download: its bytes over the Droplet's link. DigitalOcean documents 10 Gbps
# for Droplets with Premium CPUs and at most 2 Gbps for all others, and names no GPU size
# (docs/facts.md, "Droplet network limits"): the higher is the floor, so no faster link is
# assumed than one documented.
LINK_GBPS = 10.0
# A phase this many times its floor is marked: it moved its bytes far slower than the link.
FAR_ABOVE = 3.0


def budget(timeline: dict[str, Any], link_gbps: float = LINK_GBPS) -> list[str]:
    """Each phase that moved bytes, next to its floor: what it fetched, how fast, and how far
    above the link's time for the same bytes."""
    lines = []
    for phase, entry in timeline.items():
        moved, seconds = entry.get("download_bytes"), entry.get("download_seconds")
        if not moved or not seconds:
            continue
        floor = moved * 8 / (link_gbps * 1e9)
        ratio = seconds / floor if floor else 0.0
        mark = f"  <- {ratio:.0f}x its floor" if ratio > FAR_ABOVE else ""
        lines.append(
            f"  {phase:<12} fetched {moved / 1e9:,.2f} GB in {seconds:,.1f} s "
            f"({moved / 1e6 / seconds:,.0f} MB/s); at {link_gbps:g} Gbit/s: {floor:,.1f} s{mark}"
        )
    if not lines:
        return ["downloads: nothing fetched on the runs recorded (all cached, or an earlier "
                "version that did not record its bytes)"]  # fmt: skip
    return ["downloads against the link (the floor: bytes at the link's rate):", *lines]


def disks(timeline: dict[str, Any]) -> list[str]:
    """The disks preflight saw on the Droplet (DigitalOcean does not document where a GPU size's
    scratch disk appears): one line each, or nothing for a timeline without them."""
    lines = []
    for phase, entry in timeline.items():
        for d in entry.get("disks") or []:
            where = f"mounted at {d['mounts']}" if d.get("mounts") else "not mounted"
            volume = ", a Volume" if d.get("volume") else ""
            lines.append(f"  {phase:<12} {d['name']:<10} {d['gib']:>7,} GiB  {where}{volume}")
    return ["disks the Droplet saw:", *lines] if lines else []


def weights_rate(parts: dict[str, Any]) -> str | None:
    """vLLM's weight load as a rate: its GiB in GPU memory over its load time."""
    gib, seconds = parts.get("model_load_gib"), parts.get("weights_s") or parts.get("model_load_s")
    if not gib or not seconds:
        return None
    return (
        f"  {'weights read at':<42} {gib * 1.073741824 / seconds:8.2f} GB/s "
        f"({gib:,.1f} GiB per GPU in {seconds:,.1f} s; vLLM's default loader reads about 1 GB/s)"
    )


def gantt(timed: list[Span], path: str) -> None:
    plt = target_mod.pyplot()

    origin = min(s.start for s in timed)
    on_path = {s.phase for s in critical_path(timed)}
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(timed) + 1.2))
    for row, s in enumerate(timed):
        color = "tab:red" if s.phase in on_path else "tab:blue"
        ax.barh(row, max(s.seconds, 0.5), left=s.start - origin, color=color)
        ax.text(s.end - origin, row, f" {s.seconds:,.0f} s", va="center", fontsize=8)
    ax.set_yticks(range(len(timed)), [s.phase for s in timed])
    ax.invert_yaxis()
    ax.set(xlabel="seconds from the first phase's start", title="bootstrap (red: critical path)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def load(args: argparse.Namespace) -> dict[str, Any]:
    if args.outputs:
        try:
            with open(args.outputs) as f:
                outputs = json.load(f)
        except (OSError, ValueError) as err:
            raise target_mod.TargetError(f"--outputs {args.outputs}: {err}") from None
    else:
        outputs = target_mod.stack_outputs(args.stack)
    timeline = outputs.get("bootstrapTimeline") if isinstance(outputs, dict) else None
    if not isinstance(timeline, dict):
        raise target_mod.TargetError(
            "no bootstrapTimeline output: pulumi up with this version first "
            "(`pulumi stack output --json` shows the outputs)"
        )
    return timeline


def add_parser(subparsers: cli.Subparsers) -> None:
    parser = cli.subcommand(subparsers, "timeline", __doc__)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--stack", help="read the outputs of this Pulumi stack")
    source.add_argument("--outputs", help="a saved `pulumi stack output --json` file")
    parser.add_argument("--png", help="draw the bootstrap as a Gantt chart to this file")
    parser.add_argument(
        "--journal", help="vLLM's journal (logs.py --no-follow > FILE): split its start"
    )
    parser.add_argument(
        "--link-gbps",
        type=float,
        default=LINK_GBPS,
        help=f"the link a download's floor is counted at (default {LINK_GBPS:g})",
    )


def run(args: argparse.Namespace) -> int:
    if args.link_gbps <= 0:
        args.usage_error("--link-gbps: a positive number of Gbit/s")
    timeline = load(args)
    timed, untimed = spans(timeline)
    print(report(timed, untimed))
    print("\n".join(["", *budget(timeline, args.link_gbps)]))
    if seen := disks(timeline):
        print("\n".join(["", *seen]))
    if args.journal:
        try:
            with open(args.journal, errors="replace") as f:
                parts = vllm_startup.parse(f.read())
        except OSError as err:
            raise target_mod.TargetError(f"--journal {args.journal}: {err.strerror}") from None
        print(vllm_startup.report(parts))
        if rate := weights_rate(parts):
            print(rate)
    if args.png and timed:
        gantt(timed, args.png)
    return 0
