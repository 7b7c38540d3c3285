"""A Hugging Face Hub on loopback for the real `hf download` (huggingface_hub as the pinned vLLM's
lock has it, in .vllm-venv), with the faults a long download meets on the way.

It answers what `hf download ID --revision R` asks, in the order huggingface_hub 2.4.0 asks it
(_snapshot_download.py, file_download.py): the revision's commit (GET /api/models/ID/revision/R),
the tree of that commit (GET /api/models/ID/tree/COMMIT), then per file the metadata
(HEAD /ID/resolve/COMMIT/FILE: X-Repo-Commit, the ETag, the size; large files as LFS, with
X-Linked-Etag and X-Linked-Size as the Hub sends them) and the bytes (GET, with `Range: bytes=N-`
answered 206, as the Hub's CDN does). No Xet headers: hf takes the plain HTTP path.

Faults, each used once, where a file's bytes pass an offset: `cut` closes the connection there
(a reset mid-body), `stall` sends nothing more for `seconds` (longer than the client's
HF_HUB_DOWNLOAD_TIMEOUT, a read timeout) and then closes. Every GET is recorded with the Range it
asked for and the bytes it was sent, so a test can tell a resumed download from a restarted one.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

import loopback

# Files above this are LFS on the Hub (its metadata comes as X-Linked-*; the blob is its sha256).
LFS_FROM = 1024


@dataclass
class Fault:
    kind: Literal["cut", "stall"]
    at: int  # the byte of the file where it happens
    seconds: float = 0.0  # a stall's length


@dataclass
class Get:
    file: str
    range: str | None
    sent: int  # body bytes written before the answer ended (whole, cut or stalled)


@dataclass
class FakeHub:
    repo_id: str
    files: dict[str, bytes]
    revision: str = "main"
    faults: dict[str, list[Fault]] = field(default_factory=dict)
    gets: list[Get] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.commit = hashlib.sha1(f"{self.repo_id}@{self.revision}".encode()).hexdigest()  # noqa: S324 (a commit id, as git makes it)
        self.lock = threading.Lock()
        self.server = loopback.serve(self.handler())

    @property
    def url(self) -> str:
        return loopback.url(self.server)

    def close(self) -> None:
        loopback.stop(self.server)

    def etag(self, name: str) -> str:
        """The blob's name in the cache: the sha256 for an LFS file, the git blob id otherwise."""
        data = self.files[name]
        if len(data) >= LFS_FROM:
            return hashlib.sha256(data).hexdigest()
        return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # noqa: S324 (git's blob id)

    def sent(self, name: str) -> int:
        """Body bytes sent for `name` over every GET: its size, when nothing was fetched twice."""
        return sum(g.sent for g in self.gets if g.file == name)

    def tree(self) -> list[dict[str, Any]]:
        entries = []
        for name, data in sorted(self.files.items()):
            entry: dict[str, Any] = {"type": "file", "path": name, "size": len(data),
                                     "oid": hashlib.sha1(data).hexdigest()}  # noqa: S324 (a blob id)  # fmt: skip
            if len(data) >= LFS_FROM:
                entry["lfs"] = {"oid": self.etag(name), "size": len(data), "pointerSize": 134}
            entries.append(entry)
        return entries

    def handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self
        resolve = f"/{hub.repo_id}/resolve/"

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def file_of(self) -> str | None:
                path = unquote(urlsplit(self.path).path)
                if not path.startswith(resolve):
                    return None
                revision, _, name = path.removeprefix(resolve).partition("/")
                if revision not in (hub.commit, hub.revision) or name not in hub.files:
                    return None
                return name

            def do_HEAD(self) -> None:
                name = self.file_of()
                if name is None:
                    return self.answer(404, b"", {"X-Error-Code": "EntryNotFound"})
                size = len(hub.files[name])
                headers = {"X-Repo-Commit": hub.commit, "ETag": f'"{hub.etag(name)}"',
                           "Accept-Ranges": "bytes"}  # fmt: skip
                if size >= LFS_FROM:
                    headers |= {"X-Linked-Etag": f'"{hub.etag(name)}"', "X-Linked-Size": str(size)}
                self.send_response(200)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(size))
                self.end_headers()
                return None

            def do_GET(self) -> None:
                path = unquote(urlsplit(self.path).path)
                api = f"/api/models/{hub.repo_id}/"
                if path in (f"{api}revision/{hub.revision}", f"{api}revision/{hub.commit}"):
                    siblings = [{"rfilename": n} for n in sorted(hub.files)]
                    body = {"id": hub.repo_id, "sha": hub.commit, "siblings": siblings}
                    return self.answer(200, json.dumps(body).encode(), {})
                if path == f"{api}tree/{hub.commit}":
                    return self.answer(200, json.dumps(hub.tree()).encode(), {})
                name = self.file_of()
                if name is None:
                    return self.answer(404, b"not found", {"X-Error-Code": "EntryNotFound"})
                return self.send_file(name)

            def send_file(self, name: str) -> None:
                data, asked = hub.files[name], self.headers.get("Range")
                start = 0
                if asked:
                    start = int(asked.removeprefix("bytes=").split("-")[0])
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(data) - start))
                self.send_header("ETag", f'"{hub.etag(name)}"')
                self.end_headers()
                with hub.lock:
                    pending = hub.faults.get(name, [])
                    fault = next((f for f in pending if start <= f.at < len(data)), None)
                    if fault:
                        pending.remove(fault)
                end = fault.at if fault else len(data)
                record = Get(name, asked, 0)
                hub.gets.append(record)
                for offset in range(start, end, 65536):
                    chunk = data[offset : min(offset + 65536, end)]
                    self.wfile.write(chunk)
                    record.sent += len(chunk)
                self.wfile.flush()
                if fault:
                    if fault.kind == "stall":
                        time.sleep(fault.seconds)
                    self.close_connection = True
                    self.connection.close()

            def answer(self, status: int, body: bytes, headers: dict[str, str]) -> None:
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                pass

        return Handler
