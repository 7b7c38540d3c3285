"""Prometheus' text format, read one way by every reader of a /metrics page here.

The rule, one for every reader: a page is read whole or not at all.
- A line that is not the format makes the page unreadable (ParseError). prometheus_client's own
  parser raises on such a line (`text_string_to_metric_families`, prometheus/client_python
  prometheus_client/parser.py at d0b497f, the parser of release 0.26.0), and so does this one.
- A series given twice (the same name and label set) makes the page unreadable too. The format
  allows one line per series: "Each line must have a unique combination of a metric name and
  labels. Otherwise, the ingestion behavior is undefined." (prometheus/docs at c105550,
  docs/instrumenting/exposition_formats.md); OpenMetrics: "Every Metric within a MetricFamily
  MUST have a unique LabelSet" (docs/specs/om/open_metrics_spec.md). prometheus_client keeps
  both lines and leaves the choice to its caller; summing them counts a series twice, and
  keeping the last hides a broken exporter, so neither is taken: the page is refused.
Series of one name with different label sets (vLLM's `engine`, `finished_reason`) are distinct
and `totals` sums them.

With prometheus_client importable (the project's virtualenv, vLLM's) its parser reads the page;
without it (a host's or a runner's python3) `stdlib_samples` does, ported from that parser.py
(Apache-2.0) so that both give the same answer: tests/test_clients_prometheus.py runs both on the
same pages. Standard library only.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable
from types import ModuleType
from typing import NamedTuple

client_parser: ModuleType | None
try:
    import prometheus_client.parser as client_parser
except ImportError:  # a host's or a CI runner's python3: the port below reads the page
    client_parser = None

_LEGACY_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_RESERVED_LABEL = re.compile(r"^__.*$")
_ESCAPES = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}
_ESCAPE = re.compile(r'\\[\\n"]')
# The types a TYPE line may name (metrics_core.py METRIC_TYPES; untyped is unknown there).
_TYPES = ("counter", "gauge", "summary", "histogram", "gaugehistogram", "unknown", "info",
          "stateset", "untyped")  # fmt: skip
# The sample names a TYPE line admits into its family (parser.py, text_fd_to_metric_families).
_SUFFIXES = {"summary": ("_count", "_sum", ""), "histogram": ("_count", "_sum", "_bucket")}


class ParseError(ValueError):
    """The page is not Prometheus' text format (a bad line, or a series given twice)."""


class Sample(NamedTuple):
    name: str
    labels: tuple[tuple[str, str], ...]  # sorted by label name
    value: float

    @classmethod
    def of(cls, name: str, labels: dict[str, str], value: float) -> Sample:
        return cls(name, tuple(sorted(labels.items())), float(value))


def samples(text: str) -> list[Sample]:
    """Every sample of the page in order; ParseError unless the page is read whole (above)."""
    read = client_samples if client_parser is not None else stdlib_samples
    found = read(text)
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for sample in found:
        if (sample.name, sample.labels) in seen:
            raise ParseError(f"the series {sample.name}{dict(sample.labels)} is given twice")
        seen.add((sample.name, sample.labels))
    return found


def totals(text: str, names: Iterable[str]) -> dict[str, float]:
    """Per name asked for and present on the page: the sum over its series (label sets)."""
    wanted = set(names)
    sums: dict[str, float] = {}
    for sample in samples(text):
        if sample.name in wanted:
            sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    return sums


def client_samples(text: str) -> list[Sample]:
    """prometheus_client's reading of the page (it must be importable)."""
    if client_parser is None:
        raise RuntimeError("prometheus_client is not installed")
    try:
        families = list(client_parser.text_string_to_metric_families(text))
        return [Sample.of(s.name, s.labels, s.value) for f in families for s in f.samples]
    except (ValueError, IndexError) as err:
        raise ParseError(str(err)) from None


def stdlib_samples(text: str) -> list[Sample]:
    """The same reading with the standard library: the state machine of parser.py's
    text_fd_to_metric_families (a TYPE or HELP line opens a family; a counter's samples
    named as the family take `_total`, as that parser munges them)."""
    out: list[Sample] = []
    family = _Family("", "untyped", ())
    try:
        for raw in text.split("\n"):
            line = raw.strip()
            if line.startswith("#"):
                family = _comment(line, family, out)
            elif line:
                sample = _sample(line)
                if sample.name in family.allowed:
                    family.samples.append(sample)
                else:
                    family.close(out)
                    family = _Family("", "untyped", ())
                    if not sample.name:
                        raise ValueError("metric name cannot be empty")
                    out.append(sample)
        family.close(out)
    except (ValueError, IndexError) as err:
        raise ParseError(str(err)) from None
    return out


class _Family:
    """The family being read: its name, TYPE, the sample names it admits, its samples."""

    def __init__(self, name: str, kind: str, allowed: tuple[str, ...]) -> None:
        self.name, self.kind, self.allowed = name, kind, allowed
        self.samples: list[Sample] = []

    def close(self, out: list[Sample]) -> None:
        """Its samples onto `out` (a family without a name has none to give)."""
        if not self.name:
            return
        if self.kind not in _TYPES:
            raise ValueError(f"Invalid metric type: {self.kind}")
        munge = self.kind == "counter" and not self.name.endswith("_total")
        if self.kind == "counter" and self.name == "_total":
            raise ValueError("metric name cannot be empty")
        out += [s._replace(name=s.name + "_total") if munge else s for s in self.samples]


def _comment(line: str, family: _Family, out: list[Sample]) -> _Family:
    """A `#` line: HELP and TYPE open a family (when they name another), others are comments."""
    parts = _split_quoted(line, 3)
    if len(parts) < 2 or (len(parts) > 2 and parts[1] not in ("TYPE", "HELP")):
        return family
    name, quoted = _unquote(parts[2]) if len(parts) > 2 else ("", False)
    if len(parts) > 2 and not quoted and not _LEGACY_NAME.match(name):
        raise ValueError(f"invalid metric name in {line!r}")
    if parts[1] == "HELP":
        if name == family.name:
            return family
        family.close(out)
        return _Family(name, "untyped", (name,))
    if parts[1] != "TYPE":
        return family
    if len(parts) < 4:
        raise ValueError(f"a TYPE line without a type: {line!r}")
    if name != family.name:
        family.close(out)
        family = _Family(name, "untyped", ())
    family.kind = parts[3]
    family.allowed = tuple(name + s for s in _SUFFIXES.get(parts[3], ("",)))
    return family


def _escaped(text: str, at: int) -> bool:
    """Whether text[at] follows an odd run of backslashes."""
    run = 0
    while at > run and text[at - 1 - run] == "\\":
        run += 1
    return run % 2 == 1


def _next_unquoted(text: str, chars: str | None, start: int = 0) -> int:
    """The index of the next of `chars` (None: whitespace) outside quotes, or -1."""
    in_quotes = False
    for i in range(start, len(text)):
        c = text[i]
        if c == '"' and not _escaped(text, i):
            in_quotes = not in_quotes
        if not in_quotes and c in (string.whitespace if chars is None else chars):
            return i
    return -1


def _split_quoted(text: str, most: int) -> list[str]:
    """Whitespace-separated tokens outside quotes, at most `most` splits (parser.py's)."""
    tokens, x = [""], 0
    while x < len(text):
        at = _next_unquoted(text, None, x)
        if at == -1:
            tokens[-1], x = text[x:], len(text)
            continue
        if at == x:
            x += 1
            continue
        if len(tokens) > most:
            tokens[-1] = text[x:]
            break
        tokens[-1], x = text[x:at], at + 1
        tokens.append("")
    return tokens


def _unquote(text: str) -> tuple[str, bool]:
    """The text unquoted and unescaped, and whether it was quoted."""
    if not text:
        return text, False
    text, quoted = text.strip(), False
    if text[0] == '"':
        if len(text) == 1 or text[-1] != '"':
            raise ValueError("missing close quote")
        text, quoted = text[1:-1], True
    if "\\" in text:
        text = _ESCAPE.sub(lambda m: _ESCAPES[m.group(0)], text)
    return text, quoted


def _labels(text: str) -> dict[str, str]:
    """`a="1",b="x,y"` -> {"a": "1", "b": "x,y"}; ValueError naming the labels otherwise."""
    labels: dict[str, str] = {}
    rest = text.strip()
    try:
        while rest:
            name, value, rest = _next_term(rest)
            if not value:
                continue
            label, quoted = _unquote(name)
            if not quoted and not _LEGACY_NAME.match(label):
                raise ValueError
            if value[0] != '"' or _closing_quote(value) != len(value):
                raise ValueError
            if label != "__name__" and _RESERVED_LABEL.match(label):
                raise ValueError
            if label in labels:
                raise ValueError
            labels[label] = _unquote(value)[0]
    except ValueError:
        raise ValueError(f"Invalid labels: {text}") from None
    return labels


def _closing_quote(value: str) -> int:
    """One past the first unescaped quote after value[0]."""
    i = 1
    while i < len(value):
        i = value.index('"', i)
        if not _escaped(value[:i], i):
            break
        i += 1
    return i + 1


def _next_term(text: str) -> tuple[str, str, str]:
    """The next `name=value` of a label list: its name, value and the text after it."""
    if text[0] == ",":
        text = text[1:]
        if not text:
            return "", "", ""
        if text[0] == ",":
            raise ValueError("multiple commas")
    at = _next_unquoted(text, "=,}")
    name = "__name__"
    if at >= 0 and text[at] == "=":
        name, text = text[:at], text[at + 1 :]
        at = _next_unquoted(text, ",}")
    if at == -1:
        at = len(text)
    return name, text[:at].strip(), text[at:].strip()


def _value(text: str) -> float:
    if text != text.strip() or "_" in text:
        raise ValueError(f"Invalid value: {text!r}")
    try:
        return int(text)
    except ValueError:
        return float(text)


def _value_and_timestamp(text: str) -> float:
    """The value; a timestamp after it is read (it must be a number) and dropped."""
    text = text.lstrip()
    separator = " " if " " in text else "\t"
    values = [v.strip() for v in text.split(separator) if v.strip()]
    if not values:
        return float(text)
    if len(values) > 1:
        _value(values[-1])
    return _value(values[0])


def _sample(text: str) -> Sample:
    """One sample line: `name{labels} value [timestamp]` (or a quoted name in the labels)."""
    start = _next_unquoted(text, "{")
    if start == -1 or " # " in text[:start]:
        end = _next_unquoted(text, " \t")
        name = text[:end].strip()
        if not _LEGACY_NAME.match(name):
            raise ValueError(f"invalid metric name: {text}")
        return Sample.of(name, {}, _value_and_timestamp(text[end + 1 :]))
    name = text[:start].strip()
    end = _next_unquoted(text[start:], "}") + start
    labels = _labels(text[start + 1 : end])
    if not name:
        if "__name__" not in labels:
            raise ValueError(f"no metric name: {text}")
        name = labels.pop("__name__")
    elif "__name__" in labels:
        raise ValueError("metric name specified more than once")
    return Sample.of(name, labels, _value_and_timestamp(text[end + 1 :]))
