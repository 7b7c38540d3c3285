#!/usr/bin/env python3
"""Load-test an OpenAI-compatible endpoint the way `vllm bench serve` reports it.

    python scripts/bench.py --stack dev --concurrency 1,8,32 --requests 64 \\
        --input-tokens 512 --max-tokens 128 --json bench.json --plot bench.png

At each concurrency level N it keeps N streamed chat completions in flight (a closed loop) until
`--requests` have finished, then reports TTFT, inter-token latency (ITL), time per output token
(TPOT) and end-to-end latency (mean, p50, p90, p99, in ms), requests/s and token throughput.
Token counts come from the server's usage chunk (`stream_options.include_usage`), never from
counting chunks. A failed or timed-out request is counted under its kind of error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import target as target_mod
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

# Short common words: each is one token for the usual BPE vocabularies, so a prompt of N words
# is close to N tokens; the server's usage reports the exact count.
_WORDS = (  # noqa: SIM905 (a sentence reads better than a hundred quoted words)
    "the of and to in is it you that he was for on are with as his they be at one have this "
    "from or had by word but what some we can out other were all there when up use your how "
    "said an each she which do their time if will way about many then them write would like so "
    "these her long make thing see him two has look more day could go come did number sound no "
    "most people my over know water than call first who may down side been now find"
).split()


@dataclass
class Record:
    error: str | None = None
    ttft: float | None = None
    itls: list[float] = field(default_factory=list)
    e2e: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def tpot(self) -> float | None:
        if self.ttft is None or self.completion_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.completion_tokens - 1)


def synthetic_prompt(index: int, words: int, seed: int) -> str:
    """About `words` tokens, different from the first word on, so no prefix cache is shared."""
    rng = random.Random(seed * 1_000_003 + index)  # noqa: S311 (load shape, not secrets)
    return f"{index} " + " ".join(rng.choice(_WORDS) for _ in range(max(words - 1, 1)))


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if len(sorted_values) == 1:
        return sorted_values[0]
    pos = (len(sorted_values) - 1) * q / 100
    low, high = math.floor(pos), math.ceil(pos)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (pos - low)


def summary_ms(seconds: list[float]) -> dict[str, float | None]:
    if not seconds:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    ms = sorted(s * 1000 for s in seconds)
    return {
        "mean": sum(ms) / len(ms),
        "p50": percentile(ms, 50),
        "p90": percentile(ms, 90),
        "p99": percentile(ms, 99),
    }


async def _read_stream(
    response: aiohttp.ClientResponse, record: Record, start: float
) -> dict[str, Any] | None:
    """Time each chunk that carries text; return the usage chunk's counts."""
    usage: dict[str, Any] | None = None
    last = start
    async for raw in response.content:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        event = json.loads(data)
        usage = event.get("usage") or usage
        if any(target_mod.text_of(c.get("delta") or {}) for c in event.get("choices") or ()):
            now = time.perf_counter()
            if record.ttft is None:
                record.ttft = now - start
            else:
                record.itls.append(now - last)
            last = now
    return usage


async def one_request(
    session: aiohttp.ClientSession, target: target_mod.Target, body: dict[str, Any], timeout: float
) -> Record:
    record = Record()
    start = time.perf_counter()
    usage: dict[str, Any] | None = None
    try:
        async with session.post(
            target.url("chat/completions"),
            json=body,
            headers=target.headers,
            timeout=aiohttp.ClientTimeout(total=timeout),
        ) as response:
            if response.status != 200:
                await response.read()
                record.error = f"http_{response.status}"
                return record
            usage = await _read_stream(response, record, start)
    except TimeoutError:
        record.error = "timeout"
    except aiohttp.ClientError as err:
        record.error = f"connection:{type(err).__name__}"
    except (json.JSONDecodeError, UnicodeDecodeError):
        record.error = "bad_stream"
    record.e2e = time.perf_counter() - start
    if record.error is None:
        if record.ttft is None:
            record.error = "no_tokens"
        elif not usage:
            record.error = "no_usage"
        else:
            record.prompt_tokens = int(usage.get("prompt_tokens") or 0)
            record.completion_tokens = int(usage.get("completion_tokens") or 0)
    return record


def request_body(model: str, prompt: str, max_tokens: int, ignore_eos: bool) -> dict[str, Any]:
    body = target_mod.chat_body(model, prompt, max_tokens, stream=True)
    if ignore_eos:
        # vLLM extension: generate exactly max_tokens, as `vllm bench serve` does.
        body["ignore_eos"] = True
    return body


@dataclass
class Level:
    concurrency: int
    records: list[Record]
    duration: float

    def report(self) -> dict[str, Any]:
        ok = [r for r in self.records if r.ok]
        output_tokens = sum(r.completion_tokens for r in ok)
        prompt_tokens = sum(r.prompt_tokens for r in ok)
        errors = Counter(r.error for r in self.records if r.error)
        return {
            "concurrency": self.concurrency,
            "requests": len(self.records),
            "errors": sum(errors.values()),
            "errors_by_kind": dict(sorted(errors.items())),
            "duration_s": self.duration,
            "ttft_ms": summary_ms([r.ttft for r in ok if r.ttft is not None]),
            "itl_ms": summary_ms([gap for r in ok for gap in r.itls]),
            "tpot_ms": summary_ms([t for r in ok if (t := r.tpot) is not None]),
            "e2e_ms": summary_ms([r.e2e for r in ok]),
            "requests_per_s": len(ok) / self.duration if self.duration else 0.0,
            "output_tokens_per_s": output_tokens / self.duration if self.duration else 0.0,
            "total_tokens_per_s": (
                (prompt_tokens + output_tokens) / self.duration if self.duration else 0.0
            ),
            "mean_prompt_tokens": prompt_tokens / len(ok) if ok else None,
            "mean_output_tokens": output_tokens / len(ok) if ok else None,
        }


async def run_level(
    session: aiohttp.ClientSession,
    target: target_mod.Target,
    bodies: list[dict[str, Any]],
    concurrency: int,
    timeout: float,
    progress: Progress | None,
) -> Level:
    records: list[Record] = []
    pending = iter(bodies)
    task = progress.add_task(f"concurrency {concurrency}", total=len(bodies)) if progress else None

    async def worker() -> None:
        for body in pending:  # a shared iterator: each body is taken by exactly one worker
            records.append(await one_request(session, target, body, timeout))
            if progress is not None and task is not None:
                progress.advance(task)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(bodies)))))
    return Level(concurrency, records, time.perf_counter() - start)


async def first_model(session: aiohttp.ClientSession, target: target_mod.Target) -> str:
    async with session.get(target.url("models"), headers=target.headers) as response:
        if response.status != 200:
            raise target_mod.TargetError(f"GET /v1/models answered HTTP {response.status}")
        data = (await response.json()).get("data") or []
    if not data:
        raise target_mod.TargetError("/v1/models lists no model; pass --model")
    return str(data[0]["id"])


async def bench(
    args: argparse.Namespace, target: target_mod.Target, console: Console
) -> list[dict[str, Any]]:
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
    async with aiohttp.ClientSession(connector=connector) as session:
        model = target.model or await first_model(session, target)
        for i in range(args.warmup):
            body = request_body(model, synthetic_prompt(-1 - i, 16, args.seed), 8, False)
            await one_request(session, target, body, args.timeout)
        reports = []
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            disable=args.no_progress,
        ) as progress:
            for level_index, concurrency in enumerate(args.concurrency):
                bodies = [
                    request_body(
                        model,
                        synthetic_prompt(
                            level_index * args.requests + i, args.input_tokens, args.seed
                        ),
                        args.max_tokens,
                        not args.no_ignore_eos,
                    )
                    for i in range(args.requests)
                ]
                level = await run_level(
                    session, target, bodies, concurrency, args.timeout, progress
                )
                report = level.report()
                report["model"] = model
                reports.append(report)
        return reports


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def table(reports: list[dict[str, Any]]) -> Table:
    t = Table(title="bench: latency in ms (p50 / p99), throughput per second")
    for column in (
        "conc",
        "ok/err",
        "TTFT",
        "ITL",
        "TPOT",
        "E2E",
        "req/s",
        "out tok/s",
        "tot tok/s",
    ):
        t.add_column(column, justify="right")
    for r in reports:
        t.add_row(
            str(r["concurrency"]),
            f"{r['requests'] - r['errors']}/{r['errors']}",
            *(
                f"{_fmt(r[k]['p50'])} / {_fmt(r[k]['p99'])}"
                for k in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms")
            ),
            _fmt(r["requests_per_s"]),
            _fmt(r["output_tokens_per_s"]),
            _fmt(r["total_tokens_per_s"]),
        )
    return t


def plot(reports: list[dict[str, Any]], path: str) -> None:
    import matplotlib  # noqa: PLC0415 (only needed with --plot)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    conc = [r["concurrency"] for r in reports]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.plot(conc, [r["output_tokens_per_s"] for r in reports], marker="o", label="output")
    left.plot(conc, [r["total_tokens_per_s"] for r in reports], marker="o", label="total")
    left.set(xlabel="concurrency", ylabel="tokens/s", title="Throughput", xscale="log", xticks=conc)
    left.set_xticklabels([str(c) for c in conc])
    left.minorticks_off()
    left.legend()
    for q in ("p50", "p99"):
        right.plot(conc, [r["ttft_ms"][q] for r in reports], marker="o", label=f"TTFT {q}")
    right.set(
        xlabel="concurrency", ylabel="ms", title="Time to first token", xscale="log", xticks=conc
    )
    right.set_xticklabels([str(c) for c in conc])
    right.minorticks_off()
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: accepted: a list like 1,8,32") from None
    if not levels or any(level < 1 for level in levels):
        raise argparse.ArgumentTypeError(f"{text!r}: accepted: positive integers like 1,8,32")
    return levels


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    target_mod.add_arguments(parser)
    parser.add_argument(
        "--concurrency", type=_levels, default=[1, 8, 32], help="levels, e.g. 1,8,32"
    )
    parser.add_argument("--requests", type=int, default=64, help="requests per level")
    parser.add_argument(
        "--input-tokens", type=int, default=512, help="about this many prompt tokens"
    )
    parser.add_argument("--max-tokens", type=int, default=128, help="output tokens per request")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per request")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured requests first")
    parser.add_argument("--seed", type=int, default=0, help="seed for the synthetic prompts")
    parser.add_argument("--no-ignore-eos", action="store_true", help="let the model stop early")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--json", dest="json_path", help="write one object per level to this file")
    parser.add_argument("--plot", help="draw throughput and TTFT against concurrency to this PNG")
    args = parser.parse_args(argv)
    if args.requests < 1 or args.input_tokens < 1 or args.max_tokens < 1:
        parser.error("--requests, --input-tokens and --max-tokens must be positive")
    target = target_mod.resolve(args)
    console = Console(stderr=True)
    reports = asyncio.run(bench(args, target, console))
    # Wide enough for the table when stdout is a file or a CI log.
    Console(width=None if sys.stdout.isatty() else 140).print(table(reports))
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(reports, f, indent=2)
    if args.plot:
        plot(reports, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
