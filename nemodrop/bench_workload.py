"""What bench.py sends: synthetic prompts (lengths fixed or spread by a range ratio, optionally
behind a shared prefix to measure prefix caching on purpose), or prompts and answer lengths from
a dataset of conversations (ShareGPT or OpenAI messages, JSON or JSONL), or a trace that says
when each request starts and how long it is. Standard library only.

A trace (bench.py --trace FILE) is JSONL, one request a line, in the order they start:

    {"at": 0.0, "prompt_tokens": 512, "max_tokens": 128}
    {"at": 0.35, "prompt_tokens": 64, "max_tokens": 256}

`at`: seconds from the run's start (a number >= 0, never less than the line before's);
`prompt_tokens`: the synthetic prompt's length (an integer >= 1, words as below); `max_tokens`:
the answer's (an integer >= 1). No other key; blank lines are skipped. Each request's prompt is
its own (its index first), after `--shared-prefix` words when given.

There is no tokenizer here: a synthetic prompt of N short common words is close to N tokens for
the usual BPE vocabularies, and bench.py scales it by the words a token the server's own
tokenizer measured (bench_sizing.py: `words_per_token`) so that N means N tokens on any model;
a dataset answer of W words is taken as ceil(W * 4 / 3) tokens, the usual English ratio.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

# Short common words: each is one token for the usual BPE vocabularies.
WORDS = (  # noqa: SIM905 (a sentence reads better than a hundred quoted words)
    "the of and to in is it you that he was for on are with as his they be at one have this "
    "from or had by word but what some we can out other were all there when up use your how "
    "said an each she which do their time if will way about many then them write would like so "
    "these her long make thing see him two has look more day could go come did number sound no "
    "most people my over know water than call first who may down side been now find"
).split()
# Conversations whose prompt or answer is shorter than this are skipped (as vLLM's ShareGPT
# sampler skips them: too short to measure anything).
MIN_TOKENS = 4
# How a prompt's length is counted (--prompt-sizing; bench_sizing.py measures all but `words`).
SIZING_METHODS = ("auto", "tokenize", "usage", "words")


class WorkloadError(ValueError):
    """A dataset that cannot be used; the message names the file and the accepted form."""


@dataclass(frozen=True)
class TraceEntry:
    """One line of a trace: when the request starts (seconds from the run's start) and its
    prompt's and answer's lengths in tokens."""

    at: float
    prompt_tokens: int
    max_tokens: int


TRACE_FORM = (
    'one JSON object a line: {"at": seconds >= 0, not decreasing, "prompt_tokens": integer >= 1, '
    '"max_tokens": integer >= 1}'
)


def _trace_entry(line: str, previous: float) -> TraceEntry:
    """One line of a trace, or ValueError saying what is wrong with it."""
    try:
        entry = json.loads(line)
    except ValueError as err:
        raise ValueError(f"not JSON ({err.args[0]})") from None
    if not isinstance(entry, dict):
        raise ValueError("not a JSON object")
    keys = {"at", "prompt_tokens", "max_tokens"}
    if set(entry) != keys:
        missing, extra = sorted(keys - set(entry)), sorted(set(entry) - keys)
        raise ValueError("; ".join([f"missing {missing}"] * bool(missing)
                                   + [f"unknown {extra}"] * bool(extra)))  # fmt: skip
    at = entry["at"]
    if isinstance(at, bool) or not isinstance(at, int | float) or not math.isfinite(at) or at < 0:
        raise ValueError(f"at={at!r}: a number of seconds >= 0")
    if at < previous:
        raise ValueError(f"at={at!r} is before the line above's ({previous!r})")
    for key in ("prompt_tokens", "max_tokens"):
        value = entry[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{key}={value!r}: an integer >= 1")
    return TraceEntry(float(at), entry["prompt_tokens"], entry["max_tokens"])


def load_trace(path: str) -> list[TraceEntry]:
    """A trace file (the module's docstring): its requests in order; WorkloadError naming the
    file and the first bad line."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise WorkloadError(f"--trace {path}: cannot read it ({err})") from None
    entries: list[TraceEntry] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            entries.append(_trace_entry(line, entries[-1].at if entries else 0.0))
        except ValueError as err:
            raise WorkloadError(f"--trace {path}: line {number}: {err}; {TRACE_FORM}") from None
    if not entries:
        raise WorkloadError(f"--trace {path}: no request in it; {TRACE_FORM}")
    return entries


def write_trace(path: str | Path, entries: list[TraceEntry]) -> None:
    """`entries` as a trace file that load_trace reads back."""
    lines = (json.dumps({"at": round(e.at, 6), "prompt_tokens": e.prompt_tokens,
                         "max_tokens": e.max_tokens}) for e in entries)  # fmt: skip
    Path(path).write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")


@dataclass(frozen=True)
class Sample:
    prompt: str
    max_tokens: int


def estimate_tokens(text: str) -> int:
    return math.ceil(len(text.split()) * 4 / 3)


def synthetic_prompt(index: int, words: int, seed: int, prefix: str = "") -> str:
    """About `words` tokens after `prefix`, different from there on (the index comes first), so
    no prefix cache is shared beyond `prefix`."""
    rng = random.Random(seed * 1_000_003 + index)  # noqa: S311 (load shape, not secrets)
    body = f"{index} " + " ".join(rng.choice(WORDS) for _ in range(max(words - 1, 1)))
    return f"{prefix} {body}" if prefix else body


def spread(length: int, ratio: float, rng: random.Random) -> int:
    """A length drawn uniformly from [length * (1 - ratio), length * (1 + ratio)], at least 1
    (vLLM's random dataset `--random-range-ratio`)."""
    if ratio <= 0:
        return length
    low, high = max(1, math.floor(length * (1 - ratio))), max(1, math.ceil(length * (1 + ratio)))
    return rng.randint(low, high)


def _turns(entry: object) -> list[tuple[str, str]]:
    """(role, text) pairs of one dataset entry, in either conversation format."""
    if not isinstance(entry, dict):
        return []
    if isinstance(entry.get("conversations"), list):
        roles = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant"}
        return [
            (roles.get(str(t.get("from")), "other"), str(t.get("value") or ""))
            for t in entry["conversations"]
            if isinstance(t, dict)
        ]
    if isinstance(entry.get("messages"), list):
        return [
            (str(t.get("role")), str(t.get("content") or ""))
            for t in entry["messages"]
            if isinstance(t, dict)
        ]
    return []


def load_dataset(path: str) -> list[Sample]:
    """The first user turn of each conversation and the length of the answer that follows it."""
    accepted = (
        "a JSON list or JSONL of conversations: ShareGPT "
        '({"conversations": [{"from": "human", "value": ...}, {"from": "gpt", ...}]}) or '
        'OpenAI messages ({"messages": [{"role": "user", ...}, {"role": "assistant", ...}]})'
    )
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise WorkloadError(f"--dataset {path}: cannot read it ({err})") from None
    try:
        data = json.loads(text)
        entries = data if isinstance(data, list) else [data]
    except ValueError:
        try:
            entries = [json.loads(line) for line in text.splitlines() if line.strip()]
        except ValueError as err:
            raise WorkloadError(
                f"--dataset {path}: not JSON or JSONL ({err}); {accepted}"
            ) from None
    samples = []
    for entry in entries:
        turns = _turns(entry)
        for (role, prompt), (next_role, answer) in itertools.pairwise(turns):
            if role == "user" and next_role == "assistant":
                if min(estimate_tokens(prompt), estimate_tokens(answer)) >= MIN_TOKENS:
                    samples.append(Sample(prompt, estimate_tokens(answer)))
                break
    if not samples:
        raise WorkloadError(f"--dataset {path}: no usable conversation; accepted: {accepted}")
    return samples


@dataclass(frozen=True)
class Workload:
    """The request for each index of each level, the same for the same seed."""

    input_tokens: int
    max_tokens: int | None  # None: synthetic answers of 128 tokens, dataset answers as recorded
    seed: int
    range_ratio: float = 0.0
    shared_prefix: int = 0  # words every prompt starts with
    dataset: tuple[Sample, ...] = ()
    trace: tuple[TraceEntry, ...] = ()  # --trace: request i is line i's
    # Synthetic words per token of the server's tokenizer (bench_sizing.py measures it): a
    # prompt of N tokens is N times this many words. 1.0: a word taken as a token.
    words_per_token: float = 1.0

    DEFAULT_MAX_TOKENS = 128

    @functools.cached_property
    def prefix(self) -> str:
        if not self.shared_prefix:
            return ""
        rng = random.Random(self.seed)  # noqa: S311
        return " ".join(rng.choice(WORDS) for _ in range(self.shared_prefix))

    @functools.cached_property
    def order(self) -> list[int]:
        """The dataset's conversations in a seeded order, cycled through."""
        perm = list(range(len(self.dataset)))
        random.Random(self.seed).shuffle(perm)  # noqa: S311
        return perm

    def sample(self, index: int) -> Sample:
        if self.trace:
            entry = self.trace[index]
            prompt = synthetic_prompt(
                index, self.words(entry.prompt_tokens), self.seed, self.prefix
            )
            return Sample(prompt, entry.max_tokens)
        if self.dataset:
            chosen = self.dataset[self.order[index % len(self.dataset)]]
            if self.max_tokens is not None:
                return Sample(chosen.prompt, min(chosen.max_tokens, self.max_tokens))
            return chosen
        rng = random.Random(self.seed * 7_919 + index)  # noqa: S311
        words = spread(self.input_tokens, self.range_ratio, rng)
        out = spread(self.max_tokens or self.DEFAULT_MAX_TOKENS, self.range_ratio, rng)
        return Sample(synthetic_prompt(index, self.words(words), self.seed, self.prefix), out)

    def words(self, tokens: int) -> int:
        """The synthetic words that make about `tokens` of the server's tokens."""
        return max(1, round(tokens * self.words_per_token))
