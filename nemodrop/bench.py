"""Load-test an OpenAI-compatible endpoint the way `vllm bench serve` reports it.

    nemodrop bench --stack dev --concurrency 1,8,32 --requests 64 \\
        --input-tokens 512 --max-tokens 128 --json bench.json --plot bench.png
    nemodrop bench --stack dev --request-rate 5,10,20 --slo ttft=500,tpot=50

Closed loop (`--concurrency N`): N streamed chat completions stay in flight until `--requests`
have finished. Open loop (`--request-rate R`): requests start at R per second whatever the
server's pace, Poisson arrivals by default (`--burstiness`), optionally capped at
`--max-concurrency` in flight. A trace (`--trace FILE`, JSONL lines {"at": seconds,
"prompt_tokens": N, "max_tokens": M}: nemodrop/bench_workload.py) is one open-loop level that
starts each request at its line's time with its lengths. Each level reports TTFT, inter-token
latency (ITL), time per output token (TPOT) and end-to-end latency (mean, std, min, max and
`--percentiles`, in ms), requests/s, token throughput and, with `--slo`, goodput: the
requests/s that met every bound. Against a set of replicas (a stack with `replicas` >= 2, or
`--replicas N`) each level also shows output tokens/s per replica: flat as the set grows means
the replicas, not the balancer, set the pace.

A chunk counts as a token when it carries text, reasoning (Nemotron streams its reasoning first)
or a tool-call delta. Token counts come from the server's usage chunk
(`stream_options.include_usage`); a server that sends none is counted from the stream, and the
report says so (`token_counts: client`). A failed or timed-out request is counted under its kind.

The warm-up first asks GET /v1/models once: no answer, a refused key or a server not serving
yet (502, 503) stops the run there with one line naming the cause (exit 1, reach.py); --warmup 0
with --model sends nothing before the levels. Exit 3: stopped by --max-error-rate or a key
refused mid-run; exit 1 also when every request of a level failed; exit 2: bad flags.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import itertools
import json
import math
import ssl
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, TextIO

from nemodrop import bench_stats as stats
from nemodrop import cli
from nemodrop import target as target_mod
from nemodrop.bench_workload import (
    SIZING_METHODS,
    Workload,
    WorkloadError,
    load_dataset,
    load_trace,
    synthetic_prompt,
)

# The tools' requirements: a Python without them still lists the subcommand; running it says
# in one line what is missing and the command that installs it (run()).
missing: ModuleNotFoundError | None = None
try:
    import aiohttp
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from nemodrop import reach
    from nemodrop.bench_report import compare, plot, tables, write_results
    from nemodrop.bench_sizing import (
        Sizing,
        SizingError,
        size,
        tokenize_counter,
        usage_counter,
    )
except ModuleNotFoundError as err:
    missing = err


@dataclass
class Record:
    index: int = 0
    start: float = 0.0  # seconds from the level's start
    error: str | None = None
    ttft: float | None = None
    itls: list[float] = field(default_factory=list)
    e2e: float = 0.0
    prompt_tokens: int | None = 0
    completion_tokens: int = 0
    # Of the prompt, the tokens the server's prefix cache held (usage.prompt_tokens_details,
    # vLLM with --enable-prompt-tokens-details); None when it does not say.
    cached_tokens: int | None = None
    # "server": the usage chunk's counts; "client": token chunks counted (no usage was sent).
    counted_by: str = "server"
    turn: int = 0  # with --turns: which request of its session
    text: str = ""  # the answer's content, sent back as history in a session's next turn

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def tpot(self) -> float | None:
        if self.ttft is None or self.completion_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.completion_tokens - 1)


def token_chunk(delta: dict[str, Any]) -> bool:
    """A chunk that carries a token: text, reasoning, or a piece of a tool call."""
    return bool(target_mod.text_of(delta) or delta.get("tool_calls"))


async def _read_stream(
    response: aiohttp.ClientResponse, record: Record, start: float
) -> tuple[dict[str, Any] | None, int]:
    """Time each chunk that carries a token; return the usage chunk's counts and the number of
    token chunks."""
    usage: dict[str, Any] | None = None
    chunks = 0
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
        deltas = [c.get("delta") or {} for c in event.get("choices") or ()]
        record.text += "".join(str(d.get("content") or "") for d in deltas)
        if any(token_chunk(d) for d in deltas):
            chunks += 1
            now = time.perf_counter()
            if record.ttft is None:
                record.ttft = now - start
            else:
                record.itls.append(now - last)
            last = now
    return usage, chunks


async def one_request(
    session: aiohttp.ClientSession,
    target: target_mod.Target,
    body: dict[str, Any],
    timeout: float,
    record: Record | None = None,
) -> Record:
    record = record or Record()
    start = time.perf_counter()
    usage: dict[str, Any] | None = None
    chunks = 0
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
            usage, chunks = await _read_stream(response, record, start)
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
            # No usage chunk: count what streamed (one token per chunk, as vLLM streams them);
            # the prompt's length is then unknown.
            record.counted_by = "client"
            record.prompt_tokens = None
            record.completion_tokens = chunks
        else:
            record.prompt_tokens = int(usage.get("prompt_tokens") or 0)
            record.completion_tokens = int(usage.get("completion_tokens") or 0)
            details = usage.get("prompt_tokens_details") or {}
            if isinstance(details, dict) and details.get("cached_tokens") is not None:
                record.cached_tokens = int(details["cached_tokens"])
    return record


def cached_pct(ok: list[Record]) -> float | None:
    """Of the prompt tokens of the requests whose server said, the share its prefix cache held
    (the measure of cache-aware routing); None when none said."""
    said = [r for r in ok if r.cached_tokens is not None and r.prompt_tokens]
    prompt = sum(r.prompt_tokens or 0 for r in said)
    return 100 * sum(r.cached_tokens or 0 for r in said) / prompt if prompt else None


def request_body(model: str, prompt: str, max_tokens: int, ignore_eos: bool) -> dict[str, Any]:
    body = target_mod.chat_body(model, prompt, max_tokens, stream=True)
    if ignore_eos:
        # vLLM extension: generate exactly max_tokens, as `vllm bench serve` does.
        body["ignore_eos"] = True
    return body


@dataclass
class Level:
    records: list[Record]
    duration: float
    concurrency: int | None = None  # closed loop: the streams in flight; open loop: the cap
    request_rate: float | None = None  # open loop: requests/s asked for
    aborted: str | None = None

    def window(self, warmup_s: float, cooldown_s: float) -> tuple[list[Record], float]:
        """The requests that started inside the measured window, and its length: the first
        `warmup_s` and the last `cooldown_s` seconds of the level are left out."""
        end = self.duration - cooldown_s
        kept = [r for r in self.records if warmup_s <= r.start <= end]
        return kept, max(end - warmup_s, 0.0)

    def report(
        self,
        percentiles: tuple[float, ...],
        slo: dict[str, float] | None,
        warmup_s: float = 0.0,
        cooldown_s: float = 0.0,
    ) -> dict[str, Any]:
        every = self.records
        records, duration = self.window(warmup_s, cooldown_s)
        ok = [r for r in records if r.ok]
        output_tokens = sum(r.completion_tokens for r in ok)
        prompt_tokens = sum(r.prompt_tokens or 0 for r in ok)
        prompt_known = all(r.prompt_tokens is not None for r in ok)
        errors = Counter(r.error for r in records if r.error)
        per_s = (lambda n: n / duration) if duration else (lambda _: 0.0)
        starts = sorted(r.start for r in records)
        span = starts[-1] - starts[0] if len(starts) > 1 else 0.0
        counted = {r.counted_by for r in ok}
        report: dict[str, Any] = {
            "mode": "open" if self.request_rate is not None else "closed",
            "concurrency": self.concurrency,
            "request_rate": (
                None
                if self.request_rate is None
                else ("inf" if math.isinf(self.request_rate) else self.request_rate)
            ),
            # Starts per second as sent (open loop: the schedule actually kept).
            "achieved_request_rate": (len(starts) - 1) / span if span else None,
            "requests": len(records),
            "excluded_requests": len(every) - len(records),
            "errors": sum(errors.values()),
            "errors_by_kind": dict(sorted(errors.items())),
            "duration_s": duration,
            "aborted": self.aborted,
            "ttft_ms": stats.summary_ms([r.ttft for r in ok if r.ttft is not None], percentiles),
            "itl_ms": stats.summary_ms([gap for r in ok for gap in r.itls], percentiles),
            "tpot_ms": stats.summary_ms([t for r in ok if (t := r.tpot) is not None], percentiles),
            "e2e_ms": stats.summary_ms([r.e2e for r in ok], percentiles),
            "requests_per_s": per_s(len(ok)),
            "output_tokens_per_s": per_s(output_tokens),
            "total_tokens_per_s": per_s(prompt_tokens + output_tokens) if prompt_known else None,
            "mean_prompt_tokens": prompt_tokens / len(ok) if ok and prompt_known else None,
            "prefix_cached_pct": cached_pct(ok),
            "mean_output_tokens": output_tokens / len(ok) if ok else None,
            "token_counts": "/".join(sorted(counted)) if counted else None,
        }
        if slo:
            good = sum(
                1 for r in ok if stats.meets(slo, {"ttft": r.ttft, "tpot": r.tpot, "e2e": r.e2e})
            )
            report["slo_ms"] = slo
            report["goodput_requests_per_s"] = per_s(good)
            report["slo_attainment_pct"] = 100 * good / len(records) if records else None
        return report


@dataclass
class Plan:
    """How much one level sends and when it stops. Its unit is a request or, with `turns` > 1,
    a session of that many requests in sequence. It stops after `count` units, or once
    `duration` seconds have passed (no unit starts after that), or when the error rate passes
    `max_error_rate` (after 10 requests finished, so one early error does not end it)."""

    body: Callable[[int, list[dict[str, str]]], dict[str, Any]]
    count: int | None
    duration: float | None = None
    max_error_rate: float | None = None
    turns: int = 1
    finished: int = 0
    errors: int = 0
    aborted: str | None = None

    def more(self, unit: int, elapsed: float) -> bool:
        return (
            self.aborted is None
            and (self.count is None or unit < self.count)
            and (self.duration is None or elapsed < self.duration)
        )

    def done(self, record: Record) -> None:
        self.finished += 1
        self.errors += not record.ok
        if record.error in ("http_401", "http_403"):
            # A refused key is never transient: every later request would be refused too.
            status = int(record.error.removeprefix("http_"))
            self.aborted = self.aborted or reach.refused_key(status)
        limit = self.max_error_rate
        if limit is not None and self.finished >= 10 and self.errors / self.finished > limit:
            self.aborted = self.aborted or (
                f"{self.errors} of {self.finished} requests failed, past --max-error-rate {limit:g}"
            )


@dataclass
class Runner:
    """Sends a level's units and keeps what each request saw."""

    session: aiohttp.ClientSession
    target: target_mod.Target
    plan: Plan
    timeout: float
    advance: Callable[[], None]
    records: list[Record] = field(default_factory=list)
    start: float = field(default_factory=time.perf_counter)

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    async def unit(self, unit: int) -> None:
        """One request, or a session: each turn sends the conversation so far, with the
        answers the server gave, and starts when the previous one has finished."""
        history: list[dict[str, str]] = []
        for turn in range(self.plan.turns):
            index = unit * self.plan.turns + turn
            body = self.plan.body(index, history)
            record = Record(index=index, start=self.elapsed(), turn=turn)
            self.records.append(
                await one_request(self.session, self.target, body, self.timeout, record)
            )
            self.plan.done(record)
            self.advance()
            if not record.ok or self.plan.aborted:
                break
            history = [*body["messages"], {"role": "assistant", "content": record.text}]


async def run_closed(runner: Runner, concurrency: int) -> Level:
    """Keep `concurrency` units in flight until the plan says stop."""
    plan = runner.plan
    units = itertools.count()  # shared: each unit is taken by exactly one worker

    async def worker() -> None:
        while plan.more(unit := next(units), runner.elapsed()):
            await runner.unit(unit)

    workers = concurrency if plan.count is None else min(concurrency, plan.count)
    await asyncio.gather(*(worker() for _ in range(workers)))
    return Level(runner.records, runner.elapsed(), concurrency=concurrency, aborted=plan.aborted)


async def run_open(
    runner: Runner, rate: float, arrivals: Iterator[float], max_concurrency: int | None
) -> Level:
    """Start unit i at the i-th arrival time, whatever the server's pace (at most
    `max_concurrency` in flight, the rest wait their turn in order), until the plan says stop."""
    plan = runner.plan
    gate = asyncio.Semaphore(max_concurrency) if max_concurrency else None

    async def send(unit: int) -> None:
        if gate is None:
            await runner.unit(unit)
            return
        async with gate:
            await runner.unit(unit)

    tasks = []
    for unit, at in enumerate(arrivals):
        if not plan.more(unit, at):
            break
        delay = at - runner.elapsed()
        if delay > 0:
            await asyncio.sleep(delay)
        if plan.aborted:
            break
        tasks.append(asyncio.create_task(send(unit)))
    await asyncio.gather(*tasks)
    return Level(runner.records, runner.elapsed(), max_concurrency, rate, plan.aborted)


def first_model(target: target_mod.Target, args: argparse.Namespace) -> str:
    """The model to load: --model, else the first the endpoint lists. The warm-up starts by
    asking GET /v1/models once: an endpoint that gives no answer, refuses the key or is not
    serving yet stops the run here with one line (reach.probe), before any level. --warmup 0
    with --model sends nothing before the levels, not even that (a sleeping set would wake
    before the measured requests)."""
    if target.model and args.warmup == 0:
        return target.model
    response = reach.probe(target, args.timeout)
    if target.model:  # any other answer will do: the model is known
        return target.model
    if response.status_code != 200:
        raise reach.EndpointError(
            f"GET /v1/models answered HTTP {response.status_code}: pass the model with --model"
        )
    try:
        data = response.json().get("data") or []
    except (ValueError, AttributeError):
        data = []
    if not data:
        raise reach.EndpointError("/v1/models lists no model; pass --model")
    return str(data[0]["id"])


def level_plan(args: argparse.Namespace, workload: Workload, model: str, level_index: int) -> Plan:
    # Each level its own prompts (no cache carried over); far apart so levels never overlap.
    first = level_index * 1_000_000

    def body(i: int, history: list[dict[str, str]]) -> dict[str, Any]:
        sample = workload.sample(first + i)
        request = request_body(model, sample.prompt, sample.max_tokens, not args.no_ignore_eos)
        request["messages"] = [*history, *request["messages"]]
        return request

    count = len(workload.trace) if workload.trace else None if args.duration else args.requests
    return Plan(body, count, args.duration, args.max_error_rate, args.turns)


def request_line(level: int, report: dict[str, Any], record: Record) -> str:
    """One line of --save-requests: what one request saw, in seconds."""
    return json.dumps({
        "level": level,
        "mode": report["mode"],
        "concurrency": report["concurrency"],
        "request_rate": report["request_rate"],
        "index": record.index,
        "turn": record.turn,
        "start_s": record.start,
        "status": "ok" if record.ok else record.error,
        "ttft_s": record.ttft,
        "itl_s": record.itls,
        "e2e_s": record.e2e,
        "prompt_tokens": record.prompt_tokens,
        "cached_tokens": record.cached_tokens,
        "completion_tokens": record.completion_tokens,
        "token_counts": record.counted_by if record.ok else None,
    })  # fmt: skip


async def bench(
    args: argparse.Namespace,
    target: target_mod.Target,
    console: Console,
    requests_out: TextIO | None = None,
    knee: dict[str, Any] | None = None,
    workload: Workload | None = None,
) -> tuple[str, list[dict[str, Any]]]:
    """Run every level (or, with --find-knee, the search); `knee` receives its result."""
    knee = {} if knee is None else knee
    workload = workload or Workload(args.input_tokens, args.max_tokens, args.seed)
    model = first_model(target, args)
    # --cacert: the same trust for the load as for the probe.
    tls = ssl.create_default_context(cafile=target.cacert) if target.cacert else True
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, ssl=tls)
    async with aiohttp.ClientSession(connector=connector) as session:
        for i in range(args.warmup):
            body = request_body(model, synthetic_prompt(-1 - i, 16, args.seed), 8, False)
            await one_request(session, target, body, args.timeout)
        workload, sizing = await size_prompts(session, target, model, workload, args)
        open_loop = args.request_rate is not None or bool(workload.trace)
        reports: list[dict[str, Any]] = []
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            disable=args.no_progress,
        ) as progress:

            async def run(level_index: int, value: float) -> dict[str, Any]:
                plan = level_plan(args, workload, model, level_index)
                name = f"rate {value:g}/s" if open_loop else f"concurrency {value:g}"
                if workload.trace:
                    name = f"trace ({len(workload.trace)} requests)"
                total = None if plan.count is None else plan.count * plan.turns
                task = progress.add_task(name, total=total)

                def advance() -> None:
                    progress.advance(task)

                runner = Runner(session, target, plan, args.timeout, advance)
                if workload.trace:
                    arrivals = iter([e.at for e in workload.trace])
                    level = await run_open(runner, value, arrivals, args.max_concurrency)
                elif open_loop:
                    arrivals = stats.arrivals(value, args.burstiness, args.seed + level_index)
                    level = await run_open(runner, value, arrivals, args.max_concurrency)
                else:
                    level = await run_closed(runner, int(value))
                report = level.report(
                    args.percentiles, args.slo, args.warmup_seconds, args.cooldown_seconds
                )
                if sizing is not None:
                    report["prompt_sizing"] = sizing.as_dict()
                reports.append(report)
                if requests_out is not None:
                    for record in sorted(level.records, key=lambda r: r.index):
                        requests_out.write(request_line(level_index, report, record) + "\n")
                return report

            if args.find_knee:
                search = stats.KneeSearch(args.request_rate[0], args.slo_target)
                while (rate := search.next_rate()) is not None:
                    report = await run(len(reports), rate)
                    if report["aborted"]:
                        break
                    search.record(rate, report["slo_attainment_pct"])
                knee.update(search.result())
            else:
                levels = [trace_rate(workload)] if workload.trace else None
                for level_index, value in enumerate(
                    levels or args.request_rate or args.concurrency
                ):
                    if (await run(level_index, value))["aborted"]:
                        break  # a broken server: no later level would say more
        return model, reports


async def size_prompts(
    session: aiohttp.ClientSession,
    target: target_mod.Target,
    model: str,
    workload: Workload,
    args: argparse.Namespace,
) -> tuple[Workload, Sizing | None]:
    """The workload with its synthetic prompts sized in the server's tokens (bench_sizing.py),
    and how; a dataset's prompts are its own (None)."""
    if workload.dataset:
        return workload, None
    tokens = workload.trace[0].prompt_tokens if workload.trace else workload.input_tokens

    async def ask(text: str) -> int | None:
        record = await one_request(
            session, target, request_body(model, text, 1, False), args.timeout
        )
        return record.prompt_tokens if record.ok and record.counted_by == "server" else None

    sizing = await size(
        args.prompt_sizing,
        tokens,
        args.seed,
        tokenize_counter(session, target, model),
        usage_counter(ask),
    )
    return replace(workload, words_per_token=sizing.words_per_token), sizing


def trace_rate(workload: Workload) -> float:
    """A trace's mean requests/s (its level's request_rate): its requests over its span."""
    span = workload.trace[-1].at - workload.trace[0].at
    return len(workload.trace) / span if span else math.inf


def _levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: accepted: a list like 1,8,32") from None
    if not levels or any(level < 1 for level in levels):
        raise argparse.ArgumentTypeError(f"{text!r}: accepted: positive integers like 1,8,32")
    return levels


def _checked(parse: Any) -> Any:
    """An argparse type from a parser that raises ValueError with the accepted form."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    return convert


def add_parser(subparsers: cli.Subparsers) -> None:
    parser = cli.subcommand(subparsers, "bench", __doc__)
    target_mod.add_arguments(parser)
    _load_arguments(parser)
    _workload_arguments(parser)
    _run_arguments(parser)
    _report_arguments(parser)


def _load_arguments(parser: argparse.ArgumentParser) -> None:
    """How hard: the loop (closed or open), its levels, how long each runs, when to stop."""
    load = parser.add_mutually_exclusive_group()
    load.add_argument(
        "--concurrency", type=_levels, help="closed loop: streams in flight per level, e.g. 1,8,32"
    )
    load.add_argument(
        "--request-rate",
        type=_checked(stats.parse_rates),
        help="open loop: requests/s per level, e.g. 2,5,10 (inf: all at once)",
    )
    load.add_argument(
        "--trace",
        help="open loop, one level: each request at its time with its lengths, from a JSONL "
        'file of {"at": seconds, "prompt_tokens": N, "max_tokens": M} (scripts/'
        "bench_workload.py); --requests and the length flags are then unused",
    )
    parser.add_argument(
        "--burstiness",
        type=float,
        default=1.0,
        help="open loop: shape of the gamma-distributed gaps (1: Poisson; <1: burstier)",
    )
    parser.add_argument(
        "--max-concurrency", type=int, help="open loop: at most this many requests in flight"
    )
    parser.add_argument("--requests", type=int, default=64, help="requests per level")
    parser.add_argument(
        "--turns",
        type=int,
        default=1,
        help="multi-turn sessions: each of --requests is a conversation of this many requests, "
        "each sending the history with the server's answers",
    )
    parser.add_argument(
        "--duration",
        type=float,
        help="seconds per level instead of a request count (no request starts after that)",
    )
    parser.add_argument(
        "--warmup-seconds",
        type=float,
        default=0.0,
        help="leave out of the statistics the requests that start in a level's first seconds",
    )
    parser.add_argument(
        "--cooldown-seconds",
        type=float,
        default=0.0,
        help="leave out of the statistics the requests that start in a level's last seconds",
    )
    parser.add_argument(
        "--max-error-rate",
        type=float,
        help="stop (exit 3) when more than this share of requests fail, e.g. 0.05",
    )


def _workload_arguments(parser: argparse.ArgumentParser) -> None:
    """What is sent: prompt and answer lengths, shared prefixes, a dataset."""
    parser.add_argument(
        "--input-tokens",
        type=int,
        default=512,
        help="prompt tokens of each synthetic prompt, in the server's tokens (--prompt-sizing)",
    )
    parser.add_argument(
        "--prompt-sizing",
        choices=SIZING_METHODS,
        default="auto",
        help="how synthetic prompts are sized in tokens: the server's /tokenize, its usage, or "
        "a word as a token; auto: the first that answers (bench_sizing.py)",
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        help="output tokens per request (default 128; with --dataset: the recorded answer's "
        "length, capped at this when given)",
    )
    parser.add_argument(
        "--range-ratio",
        type=float,
        default=0.0,
        help="spread synthetic input and output lengths uniformly over +-this share "
        "(0.5: 256-768 for 512)",
    )
    parser.add_argument(
        "--shared-prefix",
        type=int,
        default=0,
        help="words every synthetic prompt starts with (measures prefix caching on purpose)",
    )
    parser.add_argument(
        "--dataset",
        help="prompts and answer lengths from conversations: ShareGPT or OpenAI messages, "
        "JSON or JSONL",
    )


def _run_arguments(parser: argparse.ArgumentParser) -> None:
    """How each request runs: its timeout, the warm-up, the seed, EOS."""
    parser.add_argument("--timeout", type=float, default=600, help="seconds per request")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured requests first")
    parser.add_argument("--seed", type=int, default=0, help="seed for prompts and arrivals")
    parser.add_argument("--no-ignore-eos", action="store_true", help="let the model stop early")


def _report_arguments(parser: argparse.ArgumentParser) -> None:
    """What is reported: percentiles, SLOs and the knee, files, plots, comparisons."""
    parser.add_argument(
        "--percentiles",
        type=_checked(stats.parse_percentiles),
        default=stats.DEFAULT_PERCENTILES,
        help="latency percentiles to report, e.g. 50,90,95,99,99.9 (default 50,90,99)",
    )
    parser.add_argument(
        "--slo",
        type=_checked(stats.parse_slo),
        help="bounds in ms, e.g. ttft=500,tpot=50,e2e=10000: adds goodput and attainment",
    )
    parser.add_argument(
        "--find-knee",
        action="store_true",
        help="with --slo: from the first --request-rate, double the rate until the SLO breaks, "
        "then bisect; reports the highest rate that held it",
    )
    parser.add_argument(
        "--slo-target",
        type=float,
        default=90.0,
        help="--find-knee: the share of requests (%%) that must meet the SLO (default 90)",
    )
    parser.add_argument(
        "--compare",
        nargs="+",
        metavar="RESULT",
        help="compare result files of earlier runs (--json) side by side; sends no requests",
    )
    parser.add_argument(
        "--format",
        choices=["native", "vllm"],
        default="native",
        help="--json layout: ours, or one object per level with the field names of "
        "`vllm bench serve --save-result` (one per line)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--json", dest="json_path", help="write the results to this file")
    parser.add_argument(
        "--replicas",
        type=int,
        help="replicas behind the endpoint, for per-replica throughput (default: the stack's, "
        "else 1)",
    )
    parser.add_argument("--save-requests", help="write one JSON line per request to this file")
    parser.add_argument("--plot", help="draw throughput and TTFT per level to this PNG")


def check(args: argparse.Namespace) -> None:
    """Refuse contradictory or out-of-range settings before any request is sent."""
    rates = args.request_rate or []
    closed = not rates and not args.trace
    finite = math.isfinite
    rules = (
        (
            args.requests < 1 or args.input_tokens < 1 or (args.max_tokens or 1) < 1,
            "--requests, --input-tokens and --max-tokens must be positive",
        ),
        (
            args.duration is not None and not (finite(args.duration) and args.duration > 0),
            "--duration is a positive number of seconds",
        ),
        (
            bool(args.duration) and any(math.isinf(r) for r in rates),
            "--duration needs finite request rates (inf sends everything at once)",
        ),
        (
            args.warmup_seconds < 0 or args.cooldown_seconds < 0,
            "--warmup-seconds and --cooldown-seconds are 0 or more",
        ),
        (
            args.max_error_rate is not None and not 0 <= args.max_error_rate < 1,
            "--max-error-rate is a share in [0, 1), e.g. 0.05",
        ),
        (
            not 0 <= args.range_ratio < 1,
            "--range-ratio is a share in [0, 1): 0.5 spreads 512 over 256-768",
        ),
        (args.shared_prefix < 0, "--shared-prefix is a number of words, 0 or more"),
        (args.turns < 1, "--turns is the number of requests per session, 1 or more"),
        (
            bool(args.dataset) and bool(args.range_ratio or args.shared_prefix),
            "--range-ratio and --shared-prefix shape synthetic prompts, not --dataset",
        ),
        (
            not finite(args.burstiness) or args.burstiness <= 0,
            "--burstiness must be a positive number (1: Poisson arrivals)",
        ),
        (
            args.max_concurrency is not None and args.max_concurrency < 1,
            "--max-concurrency must be a positive integer",
        ),
        (
            closed and args.max_concurrency is not None,
            "--max-concurrency caps an open loop: use it with --request-rate",
        ),
        (
            args.find_knee and (not args.slo or closed),
            "--find-knee needs --slo (what must hold) and --request-rate START",
        ),
        (
            args.find_knee and (len(rates) > 1 or any(math.isinf(r) for r in rates)),
            "--find-knee starts from one finite rate: --request-rate 5",
        ),
        (not 0 < args.slo_target <= 100, "--slo-target is a share of requests, in (0, 100]"),
        (
            bool(args.trace)
            and (
                args.turns > 1
                or bool(args.dataset or args.duration)
                or bool(args.find_knee or args.range_ratio)
            ),
            "--trace says when each request starts and its lengths: not with --dataset, "
            "--duration, --find-knee, --turns or --range-ratio",
        ),
    )
    for broken, message in rules:
        if broken:
            args.usage_error(message)
    if args.replicas is not None and args.replicas < 1:
        args.usage_error("--replicas is the number of replicas behind the endpoint, 1 or more")
    if closed and args.concurrency is None:
        args.concurrency = [1, 8, 32]


def print_report(
    args: argparse.Namespace, reports: list[dict[str, Any]], knee: dict[str, Any]
) -> None:
    """What the run sent (its prompts' sizing), its tables, and the knee when it looked for one."""
    # Wide enough for the table when stdout is a file or a CI log.
    out = Console(width=None if sys.stdout.isatty() else 160)
    sized = next((r["prompt_sizing"] for r in reports if r.get("prompt_sizing")), None)
    if sized is not None:
        out.print(Sizing.from_dict(sized).line())
    for t in tables(reports, args.percentiles):
        out.print(t)
    if args.find_knee:
        held, failed = knee["request_rate"], knee["first_failing_rate"]
        out.print(
            f"knee: {'no rate' if held is None else f'{held:g} requests/s'} held the SLO "
            f"({args.slo_target:g}% of requests within it)"
            + ("" if failed is None else f"; {failed:g} requests/s did not")
        )


def run(args: argparse.Namespace) -> int:
    if missing is not None:
        target_mod.missing_package(missing)
    if args.compare:
        return compare(args.compare, args.plot)
    check(args)
    try:
        dataset = tuple(load_dataset(args.dataset)) if args.dataset else ()
        trace = tuple(load_trace(args.trace)) if args.trace else ()
    except WorkloadError as err:
        args.usage_error(str(err))
    workload = Workload(
        args.input_tokens,
        args.max_tokens,
        args.seed,
        args.range_ratio,
        args.shared_prefix,
        dataset,
        trace,
    )
    target = target_mod.resolve(args)
    console = Console(stderr=True)
    started = datetime.datetime.now(datetime.UTC)
    requests_out = open(args.save_requests, "w") if args.save_requests else None  # noqa: SIM115
    knee: dict[str, Any] = {}
    try:
        model, reports = asyncio.run(bench(args, target, console, requests_out, knee, workload))
    except SizingError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    finally:
        if requests_out is not None:
            requests_out.close()
    replicas = args.replicas or target.replicas
    for report in reports:
        report["replicas"] = replicas
        report["output_tokens_per_s_per_replica"] = report["output_tokens_per_s"] / replicas
    print_report(args, reports, knee)
    if args.json_path:
        write_results(args, target, model, started, reports, knee)
    if args.plot:
        plot(reports, args.plot, knee if args.find_knee else None)
    aborted = [r["aborted"] for r in reports if r["aborted"]]
    if aborted:
        print(f"error: stopped: {aborted[0]}", file=sys.stderr)
        return 3
    # A level where nothing succeeded measured nothing: the run failed, whatever the table says.
    dead = [r for r in reports if r["requests"] and r["errors"] == r["requests"]]
    if dead:
        r = dead[0]
        level = (
            f"rate {r['request_rate']}/s"
            if r["mode"] == "open"
            else f"concurrency {r['concurrency']}"
        )
        print(
            f"error: all {r['requests']} requests of {level} failed ({r['errors_by_kind']}): "
            "see `nemodrop smoke` with the same endpoint",
            file=sys.stderr,
        )
        return 1
    return 0
