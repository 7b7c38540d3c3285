"""scripts/phases/autodown/settings.py: what the env file gives, read once; a bad number is
named, an empty one is "no such rule", and no token means a dry run."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import pytest
import script_module

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT / "scripts"))  # the clients the package imports


@pytest.fixture(scope="module")
def settings() -> ModuleType:
    package = script_module.load_package(
        ROOT / "scripts/phases/autodown", "ad_settings", "settings"
    )
    module: ModuleType = package.settings
    return module


def test_the_env_file_is_read_whole(settings: ModuleType) -> None:
    s = settings.read({"AUTODOWN_TOKEN": "t", "AUTODOWN_IDLE_MINUTES": "30",
                       "AUTODOWN_MAX_HOURS": "", "AUTODOWN_BOOTSTRAP_MINUTES": "90",
                       "AUTODOWN_PEER_METRICS_URLS": "http://a/metrics http://b/metrics",
                       "AUTODOWN_STATE": "/var/lib/x/autodown.json"}, dry_run=False)  # fmt: skip
    assert (s.rule.idle_minutes, s.rule.max_hours, s.rule.bootstrap_minutes) == (30, None, 90)
    assert s.peer_metrics_urls == ["http://a/metrics", "http://b/metrics"]
    assert s.state == Path("/var/lib/x/autodown.json") and s.run_seconds == settings.RUN_SECONDS
    assert s.dry_run is False


@pytest.mark.parametrize(
    ("env", "dry"),
    [({"AUTODOWN_TOKEN": ""}, True), ({"AUTODOWN_TOKEN": "t", "AUTODOWN_DRY_RUN": "true"}, True),
     ({"AUTODOWN_TOKEN": "t"}, False)],
)  # fmt: skip
def test_without_a_token_or_when_asked_it_is_a_dry_run(
    settings: ModuleType, env: dict[str, str], dry: bool
) -> None:
    assert settings.read(env, dry_run=False).dry_run is dry
    assert settings.read(env, dry_run=True).dry_run is True


@pytest.mark.parametrize("value", ["abc", "0", "-1", "nan", "inf"])
def test_a_bad_number_is_named(settings: ModuleType, value: str) -> None:
    with pytest.raises(ValueError, match=f"AUTODOWN_RUN_SECONDS='{value}' must be a positive"):
        settings.read({"AUTODOWN_RUN_SECONDS": value}, dry_run=False)
