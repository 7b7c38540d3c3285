"""scripts/phases/autodown/remove.py: no DELETE path is built from an odd value (a record, a
peer id, the metadata service's answer), and a refusal names what the token lacks."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from types import ModuleType
from typing import Any

import loopback
import pytest
import script_module

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT / "scripts"))  # the clients the package imports


@pytest.fixture(scope="module")
def remove() -> ModuleType:
    package = script_module.load_package(ROOT / "scripts/phases/autodown", "ad_remove", "remove")
    module: ModuleType = package.remove
    return module


@pytest.mark.parametrize(
    ("setting", "want"),
    [("example.com 31415926", ("example.com", "31415926")), ("", None), ("example.com", None),
     ("../x 1", None), ("EXAMPLE.com 1", None), ("example.com 1 2", None)],
)  # fmt: skip
def test_only_a_zone_and_a_numeric_id_make_a_record(
    remove: ModuleType, setting: str, want: tuple[str, str] | None
) -> None:
    assert remove.dns_record(setting) == want


def test_peer_ids_are_numbers_or_nothing_is_deleted(remove: ModuleType) -> None:
    assert remove.peer_ids("424243 424244") == ["424243", "424244"]
    assert remove.peer_ids("") == []
    assert remove.peer_ids("424243 ../droplets") is None


def test_a_refusal_names_the_token_or_the_scope(remove: ModuleType) -> None:
    assert "does not accept the token" in remove.refused(401, ("Droplets", "droplet:delete"))
    assert "it needs the scope domain:delete" in remove.refused(403, ("DNS records",
                                                                       "domain:delete"))  # fmt: skip


@pytest.fixture
def metadata() -> Iterator[dict[str, Any]]:
    """A metadata service on loopback that answers `answer["body"]`, counting the looks."""
    answer: dict[str, Any] = {"body": b"424242", "asked": 0}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            answer["asked"] += 1
            self.send_response(200)
            self.send_header("Content-Length", str(len(answer["body"])))
            self.end_headers()
            self.wfile.write(answer["body"])

        def log_message(self, *_: Any) -> None:
            pass

    server = loopback.serve(Handler)
    answer["url"] = f"{loopback.url(server)}/metadata/v1/id"
    yield answer
    loopback.stop(server)


def test_a_metadata_answer_too_long_for_an_id_is_an_answer_not_a_miss(
    remove: ModuleType, metadata: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    deadline = remove.Deadline(time.time, time.time() + 30)
    assert remove.droplet_id(metadata["url"], deadline, lambda _: None) == "424242"
    metadata["body"] = b"4" * 100
    assert remove.droplet_id(metadata["url"], deadline, lambda _: None) is None
    assert metadata["asked"] == 2, "asked once: an answer, not a service that did not answer"
    assert "answered over 64 bytes, not a Droplet id" in capsys.readouterr().out
