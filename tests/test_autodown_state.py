"""scripts/phases/autodown/state.py: the state file of any shape is a state (reset with a
reason, never a crash), times from a clock that jumped back are clamped, an earlier release's
file keeps its start, and max hours counts from the first-bootstrap record when it is sane."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
import script_module

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT / "scripts"))  # the clients the package imports
NOW = 1_800_000_000.0


@pytest.fixture(scope="module")
def state() -> ModuleType:
    package = script_module.load_package(ROOT / "scripts/phases/autodown", "ad_state", "state")
    module: ModuleType = package.state
    return module


def test_a_saved_state_loads_back_as_it_was(state: ModuleType, tmp_path: Path) -> None:
    saved = state.fresh(NOW - 60)
    saved.update(counters={"vllm:request_success_total": 3.0}, served=True,
                 peers_deleted=["424243"], unreadable_since={"http://10.0.0.2/metrics": NOW})  # fmt: skip
    state.save(tmp_path / "s.json", saved)
    assert state.load(tmp_path / "s.json", NOW) == (saved, None)
    assert not (tmp_path / "s.tmp").exists(), "written beside, then renamed"


@pytest.mark.parametrize(
    ("text", "note"),
    [
        ("{", "state file unreadable (JSONDecodeError), reset"),
        ("[]", "state file held list, not an object: reset"),
        ('{"started_at": "x", "last_activity": 1, "deleted": "yes"}',
         "state file had odd started_at, deleted: reset"),
        ('{"started_at": 1, "last_activity": 1, "peers_deleted": ["../x"]}',
         "state file had odd peers_deleted: reset"),
    ],
)  # fmt: skip
def test_an_odd_file_is_reset_with_its_reason(
    state: ModuleType, tmp_path: Path, text: str, note: str
) -> None:
    (tmp_path / "s.json").write_text(text)
    loaded, why = state.load(tmp_path / "s.json", NOW)
    assert why == note
    assert loaded["deleted"] is False and loaded["peers_deleted"] == []


def test_times_ahead_of_the_clock_are_clamped_and_an_earlier_release_keeps_its_start(
    state: ModuleType, tmp_path: Path
) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"installed_at": NOW - 3600, "last_activity": NOW + 9999,
                                "counters": {"vllm:request_success_total": 1}}))  # fmt: skip
    loaded, why = state.load(path, NOW)
    assert why is None
    assert loaded["started_at"] == NOW - 3600 and loaded["last_activity"] == NOW
    assert loaded["served"] is True, "a state with a reading, from before `served`, had served"


@pytest.mark.parametrize(
    ("record", "want"),
    [(f"{NOW - 7200}\n", (NOW - 7200, "first bootstrap")),
     (f"{NOW + 100}", (NOW, "first bootstrap")),  # within the skew: now
     (f"{NOW + 301}", (NOW - 60, "first autodown run")),
     ("nan", (NOW - 60, "first autodown run")), ("", (NOW - 60, "first autodown run"))],
)  # fmt: skip
def test_max_hours_counts_from_a_sane_first_bootstrap_record(
    state: ModuleType, tmp_path: Path, record: str, want: tuple[float, str]
) -> None:
    (tmp_path / "first").write_text(record)
    assert state.first_bootstrap(tmp_path / "first", state.fresh(NOW - 60), NOW) == want
