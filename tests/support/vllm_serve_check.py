"""Run inside .vllm-venv (the pinned vLLM, from the lock): check `vllm serve` argument lists with
that vLLM's own serve parser, its pre-load validation and its parser registries.

Reads a JSON list of {"name", "argv"} on stdin (argv: what follows `vllm serve`), prints one JSON
object: {"version": ..., "results": {name: "ok" | the error}}. vLLM's platform is set to its CPU
platform before the parser is built: this machine has no GPU, and the parser's defaults would
otherwise probe for one. The parser accepts any parser name, so the names are checked against
the registries (ReasoningParserManager, ToolParserManager: their lazy_parsers included), and
the speculative method against vLLM's SpeculativeMethod.
"""

# ruff: noqa: PLC0415 (vLLM is imported only after its platform is set, inside main)
from __future__ import annotations

import contextlib
import io
import json
import sys
from typing import Any, get_args


def _flatten(literal: Any) -> set[str]:
    out: set[str] = set()
    for arg in get_args(literal):
        out |= _flatten(arg) if get_args(arg) else {arg}
    return out


def main() -> int:
    cases = json.load(sys.stdin)
    import vllm
    from vllm import platforms
    from vllm.platforms.cpu import CpuPlatform

    platforms.current_platform = CpuPlatform()
    from vllm.config.speculative import SpeculativeMethod
    from vllm.entrypoints.common.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    reasoning = set(ReasoningParserManager.list_registered())
    tools = set(ToolParserManager.list_registered())
    methods = _flatten(SpeculativeMethod)
    results: dict[str, str] = {}
    for case in cases:
        parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
        errors = io.StringIO()
        try:
            with contextlib.redirect_stderr(errors):
                args = parser.parse_args(case["argv"])
            validate_parsed_serve_args(args)
            problems = []
            if args.reasoning_parser and args.reasoning_parser not in reasoning:
                problems.append(f"no reasoning parser {args.reasoning_parser!r} in this vLLM")
            if args.tool_call_parser and args.tool_call_parser not in tools:
                problems.append(f"no tool-call parser {args.tool_call_parser!r} in this vLLM")
            spec = args.speculative_config
            if spec is not None and spec.get("method") not in methods:
                problems.append(f"no speculative method {spec.get('method')!r} in this vLLM")
            results[case["name"]] = "; ".join(problems) or "ok"
        except SystemExit:
            results[case["name"]] = errors.getvalue().strip().splitlines()[-1]
        except (TypeError, ValueError) as err:
            results[case["name"]] = f"{type(err).__name__}: {err}"
    print(json.dumps({"version": vllm.__version__, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
