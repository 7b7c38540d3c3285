"""pulumi-command's remote Command and CopyToRemote, carried out over real SSH from the world
(net.py) to an emulated Droplet, the way the provider does it.

What pulumi-command does and this keeps (provider/pkg/provider/remote, at 010bd8e):
- one SSH session per run: the `create` (or `update`, else `create`, on an update; `delete` on a
  delete) text as the remote command, `stdin` written to it; no environment sent
  (addPreviousOutputInEnv false in this program); stdout and stderr captured as outputs; a
  non-zero exit fails the step with both (commandController.go, command.go);
- the connection pins `hostKey` and uses `privateKey` for `user`; `dialErrorLimit` -1 dials
  until SSH answers (bounded by the resource's custom timeout), else that many failed dials
  (connection.go, `Dial`);
- CopyToRemote copies its asset over SFTP to `remotePath`, creating missing parent folders
  (>= v1.2.1) (copyController.go); its `triggers` are replaceOnChanges.
"""

from __future__ import annotations

import re
import tempfile
import time
from pathlib import Path
from typing import Any

from stack import internet, net
from stack.engine import Resource

COMMAND = "command:remote:Command"
COPY = "command:remote:CopyToRemote"
# Between dials while SSH does not answer (a Droplet booting, rebooting).
DIAL_PAUSE_SECONDS = 1.0
# What ssh says when it never got a session: the dials pulumi-command retries (connection.go).
DIAL_FAILED = re.compile(
    r"ssh: connect to host|Connection refused|Connection timed out|No route to host"
    r"|kex_exchange_identification|Connection closed by .* port 22"
)
DIAL_WAIT_SECONDS = 600


class RemoteError(Exception):
    """A remote command that exited non-zero: its exit code and both of its outputs."""

    def __init__(self, name: str, code: int, stdout: str, stderr: str) -> None:
        self.code, self.stdout, self.stderr = code, stdout, stderr
        tail = "\n".join(stderr.strip().splitlines()[-12:])
        super().__init__(f"{name}: exited {code}\n{tail}")


class RemoteCommands:
    """The provider for command:remote:*, dialling from the emulation's world."""

    def __init__(
        self, world: net.World, workdir: Path, substitutions: dict[str, str] | None = None
    ) -> None:
        self.world, self.workdir = world, workdir
        # The emulation's one declared gap (internet.SUBSTITUTED): settings of artifacts that
        # cannot be had here, replaced in the scripts that set them, nothing else.
        self.substitutions = substitutions or {}

    def force_new(self, type_: str) -> frozenset[str]:
        # `triggers` is replaceOnChanges (provider/pkg/provider/common/inputs.go); a
        # CopyToRemote's source and remote path change it in place (copyController.go Update).
        return frozenset({"triggers"})

    def create(self, new: Resource) -> tuple[str, dict[str, Any]]:
        return f"{new.name}-{time.monotonic_ns()}", self._carry_out(new, "create")

    def update(self, old: Resource, new: Resource) -> dict[str, Any]:
        return self._carry_out(new, "update" if new.inputs.get("update") else "create")

    def delete(self, old: Resource) -> None:
        if old.type == COMMAND and old.inputs.get("delete"):
            self._ssh(old, str(old.inputs["delete"]), str(old.inputs.get("stdin", "")))

    def refresh(self, old: Resource) -> dict[str, Any] | None:
        """pulumi-command's Command has no Read: a refresh keeps its state as it is."""
        return old.outputs

    def read(self, new: Resource, import_id: str) -> dict[str, Any]:
        raise AssertionError("pulumi-command resources are never imported")

    def _carry_out(self, res: Resource, which: str) -> dict[str, Any]:
        if res.type == COPY:
            self._copy(res)
            return dict(res.inputs)
        stdin = str(res.inputs.get("stdin", ""))
        values = {k: v for k, v in self.substitutions.items() if f"\n{k}=" in stdin}
        if values:
            stdin = internet.substitute(stdin, values)
        stdout, stderr = self._ssh(res, str(res.inputs[which]), stdin)
        return {**res.inputs, "stdout": stdout, "stderr": stderr}

    def _ssh(self, res: Resource, command: str, stdin: str) -> tuple[str, str]:
        conn = res.inputs["connection"]
        with tempfile.TemporaryDirectory(dir=self.workdir) as tmp:
            key, known = self._credentials(Path(tmp), conn)
            target = f"{conn.get('user', 'root')}@{conn['host']}"
            waits = int(conn.get("dialErrorLimit", 10))
            deadline = time.monotonic() + DIAL_WAIT_SECONDS
            failures = 0
            while True:
                proc = self.world.run(
                    net.ssh_argv(key, known, target, command), input=stdin, timeout=7200
                )
                # Dial again only when SSH never connected (the provider retries dials, never a
                # session: one cut midway, or a command that exits 255, fails the step).
                if proc.returncode != 255 or proc.stdout or not DIAL_FAILED.search(proc.stderr):
                    break
                failures += 1
                if (waits != -1 and failures >= waits) or time.monotonic() > deadline:
                    break
                time.sleep(DIAL_PAUSE_SECONDS)
        if proc.returncode != 0:
            raise RemoteError(res.name, proc.returncode, proc.stdout, proc.stderr)
        return proc.stdout, proc.stderr

    def _copy(self, res: Resource) -> None:
        """SFTP, as the provider copies: the parent folders first (each may exist), then put."""
        conn = res.inputs["connection"]
        source = _asset_path(res.inputs["source"])
        remote = str(res.inputs["remotePath"])
        parts = remote.strip("/").split("/")[:-1]
        batch = [f"-mkdir /{'/'.join(parts[: i + 1])}" for i in range(len(parts))]
        batch.append(f"put {source} {remote}")
        with tempfile.TemporaryDirectory(dir=self.workdir) as tmp:
            key, known = self._credentials(Path(tmp), conn)
            argv = net.ssh_argv(key, known, f"{conn.get('user', 'root')}@{conn['host']}")
            argv = ["sftp", "-b", "-", *argv[1:]]
            proc = self.world.run(argv, input="\n".join(batch) + "\n", timeout=600)
        if proc.returncode != 0:
            raise RemoteError(res.name, proc.returncode, proc.stdout, proc.stderr)

    def _credentials(self, tmp: Path, conn: dict[str, Any]) -> tuple[Path, Path]:
        key = tmp / "id"
        key.touch(mode=0o600)
        key.write_text(str(conn["privateKey"]).strip() + "\n")
        known = tmp / "known_hosts"
        known.write_text(f"{conn['host']} {str(conn['hostKey']).strip()}\n")
        return key, known


def _asset_path(source: Any) -> Path:
    """A FileAsset as the wire carries it: {"4dabf...": "c44067f5...", "path": ...}."""
    if isinstance(source, dict) and "path" in source:
        return Path(source["path"])
    raise AssertionError(f"an asset the emulation does not read: {source!r}")
