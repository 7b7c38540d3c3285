"""What bench.py sends (nemodrop/bench_workload.py): synthetic lengths spread by the range ratio
(the same for the same seed), a shared prefix in every prompt and only it, a ShareGPT dataset's
prompts and answer lengths, and a dataset that cannot be used refused before any request."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_tools import (
    KEY,
    run_tool,
)

from nemodrop import bench_workload


def test_synthetic_lengths_spread_over_the_range_ratio_the_same_for_the_same_seed() -> None:
    workload = bench_workload.Workload(100, 40, seed=3, range_ratio=0.5)
    samples = [workload.sample(i) for i in range(200)]
    words = [len(s.prompt.split()) for s in samples]
    outs = [s.max_tokens for s in samples]
    assert min(words) >= 50 and max(words) <= 150 and len(set(words)) > 30
    assert min(outs) >= 20 and max(outs) <= 60 and len(set(outs)) > 15
    again = bench_workload.Workload(100, 40, seed=3, range_ratio=0.5)
    assert [again.sample(i) for i in range(200)] == samples
    fixed = bench_workload.Workload(100, 40, seed=3)
    assert {len(fixed.sample(i).prompt.split()) for i in range(20)} == {100}


def test_a_shared_prefix_is_the_same_for_every_prompt_and_only_it() -> None:
    workload = bench_workload.Workload(50, 8, seed=1, shared_prefix=30)
    prompts = [workload.sample(i).prompt.split() for i in range(10)]
    assert all(p[:30] == prompts[0][:30] for p in prompts)
    assert len({p[30] for p in prompts}) == 10, "unique from the first word after the prefix"
    plain = bench_workload.Workload(50, 8, seed=1)
    assert len({plain.sample(i).prompt.split()[0] for i in range(10)}) == 10


def sharegpt(tmp_path: Path) -> Path:
    path = tmp_path / "sharegpt.json"
    path.write_text(
        json.dumps([
            {"conversations": [
                {"from": "human", "value": "tell me about the sea and the ships on it " * 2},
                {"from": "gpt", "value": "word " * 30},
            ]},
            {"conversations": [{"from": "human", "value": "too short"}, {"from": "gpt", "value": "ok"}]},
            {"conversations": [
                {"from": "system", "value": "be brief"},
                {"from": "human", "value": "list the planets of the solar system please now"},
                {"from": "gpt", "value": "word " * 60},
            ]},
            {"id": "no conversation here"},
        ])
    )  # fmt: skip
    return path


def test_a_sharegpt_dataset_gives_prompts_and_answer_lengths(tmp_path: Path) -> None:
    samples = bench_workload.load_dataset(str(sharegpt(tmp_path)))
    assert [s.max_tokens for s in samples] == [40, 80], "30 and 60 words as tokens; short skipped"
    assert samples[1].prompt.startswith("list the planets")
    jsonl = tmp_path / "openai.jsonl"
    jsonl.write_text(
        json.dumps({"messages": [
            {"role": "user", "content": "what is the capital city of france again"},
            {"role": "assistant", "content": "word " * 15},
        ]}) + "\n"
    )  # fmt: skip
    [sample] = bench_workload.load_dataset(str(jsonl))
    assert sample.max_tokens == 20


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not JSON or JSONL"),
        ("[]", "no usable conversation"),
        ('[{"a": 1}]', "ShareGPT"),
    ],
)
def test_a_dataset_that_cannot_be_used_is_refused_before_any_request(
    tmp_path: Path, content: str, message: str
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    proc = run_tool(
        "bench", "--endpoint", "http://127.0.0.1:9/v1", "--api-key", KEY, "--dataset", str(bad)
    )
    assert proc.returncode == 2 and message in proc.stderr
