"""The workflows as a GitHub-hosted runner runs them: the user `runner` (uid 1001), passwordless
sudo, the image's packages (no pebble), Python from actions/setup-python in a tool cache the user
owns. Here that user is a process: setpriv drops this root test to uid/gid 1001 with no groups
and no new privileges, with its own HOME, TMPDIR and workspace in a temporary folder it owns, and
a PATH of the machine's programs less pebble and sudo, plus a fake `sudo` that records each call
and answers as the test asks (0: no password needed; 1: "a password is required"). Nothing of the
machine's user database or system configuration is touched.

What runs is the real thing: scripts/ci/system-packages.sh (./check's system-packages step) and
the `run:` blocks of the workflows' jobs up to `pulumi up`, taken from the YAML, their `${{ }}`
expressions rendered with test values, run with bash as GitHub runs them (`bash -e`, or `bash
--noprofile --norc -eo pipefail` for `shell: bash`), against a fake GitHub API on loopback. The
jobs' `if:` conditions are evaluated as GitHub does (status functions over `needs`)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml
from pulumi_harness import ROOT

UID = GID = 1001  # `runner` on GitHub's Ubuntu images
SHA = "0123456789abcdef0123456789abcdef01234567"
REPO = "octo-org/llm-infra"
# The image's python3 (tested.py runs on it; root's pyenv is closed to uid 1001).
SYSTEM_PYTHON = "/usr/bin/python3"

CAN_BECOME_RUNNER = (
    os.geteuid() == 0 and shutil.which("setpriv") is not None and os.access(SYSTEM_PYTHON, os.X_OK)
)
BECOMING_RUNNER = (
    "becoming uid 1001 needs root and setpriv, and its python3 the system's (CI and the dev"
    " machines have all three)"
)
pytestmark = pytest.mark.skipif(not CAN_BECOME_RUNNER, reason=BECOMING_RUNNER)


def load(path: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / path).read_text())
    return data


# --- GitHub's expressions: enough of them for our workflows, and loud about the rest -----------

_TOKEN = re.compile(r"\s*(?:(\|\||&&|==|!=|!|\(|\)|,)|'((?:[^']|'')*)'|([A-Za-z_][\w.-]*))")


@dataclass
class Expr:
    """One `${{ }}` expression, evaluated against a context as GitHub does: `a || b` is the first
    truthy operand, `a && b` the first falsy one or the last, `==` ignores case on strings, a
    missing property is ''. Unknown syntax raises, so an expression this cannot read fails the
    test instead of rendering as something else."""

    text: str
    ctx: dict[str, Any]
    funcs: dict[str, Any] = field(default_factory=dict)
    tokens: list[tuple[str, str]] = field(init=False)

    def __post_init__(self) -> None:
        self.tokens, pos = [], 0
        while pos < len(self.text.rstrip()):
            m = _TOKEN.match(self.text, pos)
            assert m, f"cannot read {self.text[pos:]!r} in {self.text!r}"
            op, string, name = m.groups()
            self.tokens.append(
                ("op", op) if op else ("str", string.replace("''", "'")) if string is not None
                else ("name", name)
            )  # fmt: skip
            pos = m.end()

    def value(self) -> Any:
        v = self._or()
        assert not self.tokens, f"left over {self.tokens} in {self.text!r}"
        return v

    def _eat(self, op: str) -> bool:
        if self.tokens and self.tokens[0] == ("op", op):
            self.tokens.pop(0)
            return True
        return False

    def _or(self) -> Any:
        v = self._and()
        while self._eat("||"):
            w = self._and()
            v = v if v else w
        return v

    def _and(self) -> Any:
        v = self._cmp()
        while self._eat("&&"):
            w = self._cmp()
            v = w if v else v
        return v

    def _cmp(self) -> Any:
        v = self._not()
        for op in ("==", "!="):
            if self._eat(op):
                w = self._not()
                same = (str(v).lower() == str(w).lower()) if isinstance(v, str) else v == w
                return same if op == "==" else not same
        return v

    def _not(self) -> Any:
        if self._eat("!"):
            return not self._not()
        return self._atom()

    def _atom(self) -> Any:
        kind, tok = self.tokens.pop(0)
        if (kind, tok) == ("op", "("):
            v = self._or()
            assert self._eat(")"), self.text
            return v
        if kind == "str":
            return tok
        assert kind == "name", f"unexpected {tok!r} in {self.text!r}"
        if tok in ("true", "false"):
            return tok == "true"
        if self._eat("("):
            assert self._eat(")"), f"{tok}() takes no arguments here: {self.text!r}"
            return self.funcs[tok]()
        v: Any = self.ctx
        for part in tok.split("."):
            v = v.get(part, "") if isinstance(v, dict) else ""
        return v


def render(text: Any, ctx: dict[str, Any]) -> str:
    """A YAML value with `${{ }}` in it, as the runner hands it to a step."""

    def one(m: re.Match[str]) -> str:
        v = Expr(m[1], ctx).value()
        return ("true" if v else "false") if isinstance(v, bool) else str(v)

    return re.sub(r"\$\{\{(.*?)\}\}", one, str(text))


def job_runs(
    job: dict[str, Any], needs: dict[str, dict[str, Any]], cancelled: bool = False
) -> bool:
    """Whether GitHub starts a job, given the results and outputs of the jobs it needs (and,
    through them, of theirs: `failure()` looks at every job upstream). Without a status function
    in `if:`, GitHub adds `success() &&`: a skipped or failed need skips the job."""
    results = [n["result"] for n in needs.values()] + [
        r for n in needs.values() for r in n.get("upstream", [])
    ]
    funcs = {
        "success": lambda: not cancelled and all(r == "success" for r in results),
        "failure": lambda: any(r == "failure" for r in results),
        "cancelled": lambda: cancelled,
        "always": lambda: True,
    }
    return bool(Expr(condition(job), {"needs": needs}, funcs).value())


def condition(job_or_step: dict[str, Any]) -> str:
    """An `if:` as GitHub evaluates it: without `${{ }}`, and with `success() &&` in front when
    it names no status function."""
    cond = str(job_or_step.get("if", "success()")).strip()
    cond = cond[3:-2] if cond.startswith("${{") else cond
    if not re.search(r"\b(success|failure|cancelled|always)\(\)", cond):
        cond = f"success() && ({cond})"
    return cond


def step_runs(step: dict[str, Any], ctx: dict[str, Any]) -> bool:
    """Whether the runner takes a step: its `if:` against the job's context. Job.steps stops at
    the first failed step that may not fail, so every step it asks about comes after successes
    only."""
    funcs = {"success": lambda: True, "failure": lambda: False,
             "cancelled": lambda: False, "always": lambda: True}  # fmt: skip
    return bool(Expr(condition(step), ctx, funcs).value())


# --- the runner-like user ---------------------------------------------------------------------


@dataclass
class Runner:
    """A uid-1001 world in one temporary folder: home, tmp, workspace (a copy of the files the
    jobs use), a PATH without pebble or sudo, a fake sudo and a fake apt-get that record."""

    root: Path

    @property
    def ws(self) -> Path:
        return self.root / "work" / "repo"

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @property
    def tool(self) -> Path:
        """What actions/setup-python adds: `$RUNNER_TOOL_CACHE/Python/<version>/x64`."""
        return self.root / "hostedtoolcache" / "Python" / "3.12.0" / "x64"

    def fake(self, name: str, rc: int, say: str = "") -> None:
        """`name` records its arguments (one call a line, NUL between them) and exits `rc`."""
        log = self.root / "log" / f"{name}.log"
        script = self.bin / name
        script.unlink(missing_ok=True)
        script.write_text(
            "#!/bin/bash\n"
            f"printf '%s\\0' \"$@\" >> {log}; printf '\\n' >> {log}\n"
            + (f"echo {say!r} >&2\n" if say else "")
            + f"exit {rc}\n"
        )
        script.chmod(0o755)
        os.chown(script, UID, GID)

    def calls(self, name: str) -> list[list[str]]:
        log = self.root / "log" / f"{name}.log"
        if not log.exists():
            return []
        return [line.split("\0")[:-1] for line in log.read_text().splitlines()]

    def env(self, **extra: str) -> dict[str, str]:
        return {
            "PATH": str(self.bin),
            "HOME": str(self.root / "home"),
            "TMPDIR": str(self.root / "tmp"),
            "USER": "runner",
            "LANG": "C.UTF-8",
            **extra,
        }

    def run(
        self, argv: list[str], env: dict[str, str], as_root: bool = False
    ) -> subprocess.CompletedProcess[str]:
        drop = [
            "setpriv", f"--reuid={UID}", f"--regid={GID}", "--clear-groups", "--no-new-privs", "--",
        ]  # fmt: skip
        return subprocess.run(
            ([] if as_root else drop) + argv,
            cwd=self.ws, env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip


def _lease_checkout() -> list[str]:
    """What lease.yml's sparse checkout brings (deploy.yml's lease look runs the same lease.py)."""
    steps = yaml.safe_load((ROOT / ".github/workflows/lease.yml").read_text())["jobs"]["lease"]
    [checkout] = [
        s for s in steps["steps"] if str(s.get("uses", "")).startswith("actions/checkout")
    ]
    return str(checkout["with"]["sparse-checkout"]).split()


WORKSPACE_FILES = [
    "check",
    "scripts/ci/system-packages.sh",
    "scripts/ci/check-on-runner.sh",
    "scripts/ci/tested.py",
    *_lease_checkout(),
    "requirements.txt",
    "policy/requirements.txt",
    "scripts/ci/which_platform.py",
    *sorted(f"stacks/{p.name}" for p in (ROOT / "stacks").glob("Pulumi.*.yaml")),
]


@contextmanager
def runner_user() -> Iterator[Runner]:
    """The user `runner` and its workspace (test_tested.py's fixture takes it too)."""
    # Not under pytest's tmp_path: its parents are root's, mode 0700, closed to uid 1001.
    root = Path(tempfile.mkdtemp(prefix="nemotron-runner-"))
    try:
        r = Runner(root)
        for d in ("home", "tmp", "log", "bin", "work/repo"):
            (root / d).mkdir(parents=True)
        for name in WORKSPACE_FILES:
            dst = r.ws / name
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dst)
        # The machine's programs, less what a runner image lacks (pebble) or what is faked.
        for d in ("/usr/bin", "/usr/sbin"):
            for p in Path(d).iterdir():
                if p.name not in ("pebble", "sudo", "apt-get") and not (r.bin / p.name).exists():
                    (r.bin / p.name).symlink_to(p)
        r.fake("apt-get", 1, "apt-get: not to be run by these tests")
        # setup-python's Python: the job runs `python`; the real venv, a fake pip (no registry).
        (r.tool / "bin").mkdir(parents=True)
        (r.tool / "lib").mkdir()
        python = r.tool / "bin" / "python"
        python.write_text(
            """#!/bin/bash
if [ "$1 $2" = "-m venv" ]; then
  /usr/bin/python3 -m venv --without-pip "$3" || exit
  cat > "$3/bin/pip" <<'PIP'
#!/bin/bash
printf '%s\\0' "$@" >> LOG; printf '\\n' >> LOG
touch "$(dirname "$0")/../pip-installed"
PIP
  chmod +x "$3/bin/pip"; exit
fi
exec /usr/bin/python3 "$@"
""".replace("LOG", str(root / "log" / "pip.log"))
        )
        python.chmod(0o755)
        for p in [root, *root.rglob("*")]:
            os.chown(p, UID, GID, follow_symlinks=False)
        yield r
    finally:
        shutil.rmtree(root)


@pytest.fixture
def runner() -> Iterator[Runner]:
    with runner_user() as r:
        yield r


def test_the_runner_user_is_uid_1001_without_pebble_or_sudo_or_root_powers(runner: Runner) -> None:
    proc = runner.run(
        ["bash", "-c", "id -u; id -g; id -G; command -v pebble sudo || true; "
         "touch /etc/nemotron-runner-probe 2>/dev/null && echo WROTE-ETC; echo $HOME; pwd"],
        runner.env(),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    uid, gid, groups, home, cwd = proc.stdout.split("\n")[:5]
    assert (uid, gid, groups) == ("1001", "1001", "1001")
    assert home == str(runner.root / "home") and cwd == str(runner.ws)
    assert "WROTE-ETC" not in proc.stdout and not Path("/etc/nemotron-runner-probe").exists()


# --- (a) ./check's system-packages step as that user ------------------------------------------


def system_packages(runner: Runner, as_root: bool = False) -> subprocess.CompletedProcess[str]:
    return runner.run(["bash", "scripts/ci/system-packages.sh"], runner.env(), as_root=as_root)


def test_a_user_with_passwordless_sudo_installs_the_missing_pebble_with_sudo_n_apt_get(
    runner: Runner,
) -> None:
    runner.fake("sudo", 0)
    proc = system_packages(runner)
    assert proc.returncode == 0, proc.stderr
    calls = runner.calls("sudo")
    assert calls[0] == ["-n", "true"]  # asks first, never prompts
    assert calls[1] == ["-n", "apt-get", "update", "-qq"]
    install = calls[2]
    assert install[:5] == ["-n", "env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install"]
    assert install[5:8] == ["-y", "-qq", "--no-install-recommends"]
    assert "pebble" in install[8:]
    assert runner.calls("apt-get") == []  # never apt-get itself as a user
    assert "installing pebble" in proc.stdout and "with sudo -n" in proc.stdout


@pytest.mark.parametrize(
    ("sudo_rc", "sudo_calls"), [(1, [["-n", "true"]]), (None, [])], ids=["password", "no-sudo"]
)
def test_a_user_whose_sudo_wants_a_password_gets_the_clear_message(
    runner: Runner, sudo_rc: int | None, sudo_calls: list[list[str]]
) -> None:
    if sudo_rc is not None:
        runner.fake("sudo", sudo_rc, "sudo: a password is required")
    proc = system_packages(runner)
    assert proc.returncode == 1
    assert "[check] missing pebble: install them (the tests use the real programs)" in proc.stderr
    assert "no sudo without a password" in proc.stderr
    assert runner.calls("sudo") == sudo_calls
    assert runner.calls("apt-get") == []


def test_nothing_missing_asks_nobody(runner: Runner) -> None:
    runner.fake("sudo", 0)
    runner.fake("pebble", 0)
    proc = system_packages(runner)
    assert proc.returncode == 0, proc.stderr
    assert runner.calls("sudo") == [] and proc.stdout == ""


def test_root_installs_with_apt_get_directly_as_before(runner: Runner) -> None:
    runner.fake("sudo", 0)
    runner.fake("apt-get", 0)
    proc = system_packages(runner, as_root=True)
    assert proc.returncode == 0, proc.stderr
    assert runner.calls("sudo") == []
    update, install = runner.calls("apt-get")
    assert update == ["update", "-qq"]
    assert install[:4] == ["install", "-y", "-qq", "--no-install-recommends"]
    assert "pebble" in install[4:]


# --- (b) the workflows' jobs up to `pulumi up`, as that user ----------------------------------


@dataclass
class FakeGitHub:
    """GET .../actions/workflows/{file}/runs and .../actions/runs/{id}/jobs, from `answers`
    (path -> (status, body)); every request is kept with its query and Authorization."""

    answers: dict[str, tuple[int, Any]] = field(default_factory=dict)
    requests: list[tuple[str, dict[str, list[str]], str]] = field(default_factory=list)


@contextmanager
def github_on_loopback() -> Iterator[tuple[FakeGitHub, str]]:
    """FakeGitHub served on 127.0.0.1 (test_tested.py's fixture takes it too)."""
    fake = FakeGitHub()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urlsplit(self.path)
            fake.requests.append((url.path, parse_qs(url.query), self.headers["Authorization"]))
            status, body = fake.answers.get(url.path, (404, {"message": "Not Found"}))
            raw = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def github() -> Iterator[tuple[FakeGitHub, str]]:
    with github_on_loopback() as served:
        yield served


def runs_path(workflow: str = "deploy.yml") -> str:
    return f"/repos/{REPO}/actions/workflows/{workflow}/runs"


def a_run(
    run_id: int, *jobs: tuple[str, str], sha: str = SHA
) -> tuple[dict[str, tuple[int, Any]], dict[str, Any]]:
    """The answers for one earlier run of deploy.yml for `sha`, with its jobs' conclusions."""
    return {
        f"/repos/{REPO}/actions/runs/{run_id}/jobs": (
            200,
            {
                "total_count": len(jobs),
                "jobs": [
                    {"name": n, "status": "completed", "conclusion": c, "run_attempt": 1}
                    for n, c in jobs
                ],
            },
        ),
    }, {
        "id": run_id,
        "head_sha": sha,
        "event": "push",
        "status": "completed",
        "html_url": f"https://gh/run/{run_id}",
    }


@dataclass
class Job:
    """Runs one job's steps up to `pulumi up`, as the runner would: checkout is the workspace,
    setup-python puts the tool cache's Python first, a local composite action runs its steps,
    each `run:` goes to bash with the step's env and what earlier steps wrote to $GITHUB_ENV."""

    runner: Runner
    ctx: dict[str, Any]
    genv: dict[str, str] = field(default_factory=dict)
    outputs: dict[str, dict[str, str]] = field(default_factory=dict)
    ran: list[str] = field(default_factory=list)
    stdout: str = ""  # set by ask_tested: the `ask` step's
    out: dict[str, str] = field(default_factory=dict)  # each step's stdout and stderr, by name
    conclusion: str = "success"  # a failed step that may fail (continue-on-error) leaves it
    summary: str = ""
    through_pulumi: bool = False  # run pulumi/actions' stand-in against a fake `pulumi` too

    def steps(
        self, steps: list[dict[str, Any]], ctx: dict[str, Any]
    ) -> subprocess.CompletedProcess[str] | None:
        """The job's steps up to `pulumi up` (or through it, `through_pulumi`), as the runner
        takes them: a step's `if:`, the first failed step ends the job unless it may fail
        (`continue-on-error`)."""
        proc = None
        for step in steps:
            uses = str(step.get("uses", ""))
            if uses.startswith("pulumi/actions@") and not self.through_pulumi:
                break  # the steps before `pulumi up` end here
            if uses.startswith("actions/checkout@"):
                continue  # the workspace is the checkout
            if uses.startswith("actions/setup-python@"):
                # What setup-python exports (actions/setup-python src/find-python.ts).
                self.genv["LD_LIBRARY_PATH"] = str(self.runner.tool / "lib")
                self.genv["pythonLocation"] = str(self.runner.tool)
                self.genv["PATH"] = f"{self.runner.tool}/bin:{self.runner.bin}"
                self.ran.append("setup-python")
                continue
            if uses.startswith("./"):
                action = load(f"{uses[2:]}/action.yml")
                inputs = {k: str(v.get("default", "")) for k, v in action["inputs"].items()}
                inputs |= {k: render(v, ctx) for k, v in step.get("with", {}).items()}
                inner = {**ctx, "inputs": inputs, "steps": {}}
                proc = self.steps(action["runs"]["steps"], inner)
                if proc is not None and proc.returncode:
                    return proc
                self.outputs[step.get("id", uses)] = {
                    k: render(v["value"], inner) for k, v in action.get("outputs", {}).items()
                }
                continue
            if not step_runs(step, ctx):
                self.ran.append(f"skipped: {step.get('name', step.get('run', uses))}")
                continue
            if uses.startswith("pulumi/actions@"):
                proc = self.pulumi_action(step, ctx)
            else:
                assert not uses, f"no stand-in for {uses}: add one"
                proc = self.run(step, ctx)
            if proc.returncode and not step.get("continue-on-error"):
                self.conclusion = "failure"
                return proc
        return proc

    def run(self, step: dict[str, Any], ctx: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        n = len(self.ran)
        files = {k: self.runner.root / "tmp" / f"{k.lower()}-{n}" for k in
                 ("GITHUB_OUTPUT", "GITHUB_ENV", "GITHUB_STEP_SUMMARY")}  # fmt: skip
        script = self.runner.root / "tmp" / f"step-{n}.sh"
        script.write_text(render(step["run"], ctx))
        for p in [script, *files.values()]:
            p.touch()
            os.chown(p, UID, GID)
        env = self.runner.env(**self.genv)
        env |= {k: render(v, ctx) for k, v in step.get("env", {}).items()}
        env |= {k: str(p) for k, p in files.items()}
        shell = (
            ["bash", "--noprofile", "--norc", "-eo", "pipefail"] if step.get("shell") == "bash"
            else ["bash", "-e"]
        )  # fmt: skip
        proc = self.runner.run([*shell, str(script)], env)
        self.ran.append(step.get("name", step["run"].split("\n")[0]))
        self.out[self.ran[-1]] = proc.stdout + proc.stderr
        if step.get("id"):
            out = dict(
                line.split("=", 1) for line in files["GITHUB_OUTPUT"].read_text().splitlines()
            )
            self.outputs[step["id"]] = out
            ctx.setdefault("steps", {})[step["id"]] = {"outputs": out}
        for line in files["GITHUB_ENV"].read_text().splitlines():
            k, v = line.split("=", 1)
            self.genv[k] = v
        self.summary += files["GITHUB_STEP_SUMMARY"].read_text()  # GitHub shows every step's
        return proc

    def pulumi_action(
        self, step: dict[str, Any], ctx: dict[str, Any]
    ) -> subprocess.CompletedProcess[str]:
        """pulumi/actions@v7 as its source drives the CLI on PATH (src/main.ts, src/config.ts):
        `upsert` selects or creates the stack (LocalWorkspace.createOrSelectStack: `stack select
        --stack NAME` first), then the command through the Automation API (@pulumi/pulumi 3.206
        sdk/nodejs/automation/stack.ts): up `--yes --skip-preview`, `--refresh` when asked, the
        policy packs; refresh `--skip-preview --yes`; destroy `--yes --skip-preview`, `--refresh`
        when asked; each with `--stack NAME` (display flags left out). The action has no
        run-program input, so no `--run-program` flag: the CLI's default holds. The step's env
        reaches the CLI (the action's own process env, which execa extends)."""
        w = {k: render(v, ctx) for k, v in step["with"].items()}
        command, stack = w["command"], w["stack-name"]
        argv = {"up": ["up", "--yes", "--skip-preview"], "refresh": ["refresh", "--skip-preview", "--yes"],
                "destroy": ["destroy", "--yes", "--skip-preview"]}[command]  # fmt: skip
        # A YAML `true` renders "True": @actions/core getBooleanInput takes true, True, TRUE.
        if command != "refresh" and w.get("refresh", "").lower() == "true":
            argv.append("--refresh")
        if command == "up":
            argv += ["--policy-pack", w["policyPacks"]]
            argv += ["--policy-pack-config", w["policyPackConfigs"]]
        env = self.runner.env(**self.genv) | {
            k: render(v, ctx) for k, v in step.get("env", {}).items()
        }
        for call in (["stack", "select", "--stack", stack], [*argv, "--stack", stack]):
            proc = self.runner.run(["pulumi", *call], env)
            if proc.returncode:
                break
        self.ran.append(step.get("name", f"pulumi {command}"))
        self.out[self.ran[-1]] = proc.stdout + proc.stderr
        return proc


def context(api: str, command: str | None, **vars_: str) -> dict[str, Any]:
    """A push has no inputs (''), a dispatch has the waker's."""
    inputs = {} if command is None else {"stack": "dev", "command": command, "refresh": True}
    return {
        "inputs": inputs,
        "vars": vars_,
        "secrets": {"GITHUB_TOKEN": "ghs-test-token", "DIGITALOCEAN_TOKEN": "do-secret"},
        "github": {"sha": SHA, "repository": REPO},
        "env": {"GITHUB_API_URL": api, "GITHUB_REPOSITORY": REPO, "GITHUB_SHA": SHA,
                "GITHUB_RUN_ID": "777", "GITHUB_ACTIONS": "true"},
    }  # fmt: skip


def ask_tested(runner: Runner, api: str, command: str | None) -> Job:
    wf = load(".github/workflows/deploy.yml")
    ctx = context(api, command)
    job = Job(runner, ctx, genv=dict(ctx["env"]))
    proc = job.steps(wf["jobs"]["tested"]["steps"], ctx)
    assert job.conclusion == "success", (proc and proc.stdout, proc and proc.stderr)
    ask = next(s for s in wf["jobs"]["tested"]["steps"] if s.get("id") == "ask")
    job.stdout = job.out[ask["name"]]
    return job


def which_jobs_run(
    run_tests: str,
    test_result: str = "success",
    cancelled: bool = False,
    tested_result: str = "success",
) -> list[str]:
    """deploy.yml's jobs GitHub starts, given `tested`'s answer and how `test` ends if it runs."""
    jobs = load(".github/workflows/deploy.yml")["jobs"]
    tested = {"result": tested_result, "outputs": {"run-tests": run_tests}}
    ran = ["tested"]
    test = {"result": "skipped", "outputs": {}, "upstream": [tested_result]}
    if job_runs(jobs["test"], {"tested": tested}, cancelled):
        ran.append("test")
        test["result"] = test_result
    if job_runs(jobs["deploy"], {"tested": tested, "test": test}, cancelled):
        ran.append("deploy")
    return ran


LEASE_LOOK = "Does the lease's schedule still run?"  # deploy.yml's step


def lease_answers(state: str, hours_ago: float, lease_step: str) -> dict[str, tuple[int, Any]]:
    """GitHub's answers about lease.yml: its state, its last scheduled run (`hours_ago`, ended
    `success`), and that run's lease step (`success`, or `skipped` without the secret)."""
    created = datetime.now(UTC) - timedelta(hours=hours_ago)
    stamp = created.strftime("%Y-%m-%dT%H:%M:%SZ")
    workflow = f"/repos/{REPO}/actions/workflows/lease.yml"
    run = {"id": 70, "event": "schedule", "display_title": "lease", "status": "completed",
           "conclusion": "success", "created_at": stamp, "updated_at": stamp,
           "html_url": "https://gh/run/70"}  # fmt: skip
    step = {"name": "Delete the GPU Droplets past their lease", "conclusion": lease_step}
    return {
        workflow: (200, {"id": 7, "path": ".github/workflows/lease.yml", "state": state}),
        f"{workflow}/runs": (200, {"total_count": 1, "workflow_runs": [run]}),
        f"/repos/{REPO}/actions/runs/70/jobs": (200, {"total_count": 1, "jobs": [
            {"name": "lease", "status": "completed", "conclusion": "success", "steps": [step]}]}),
    }  # fmt: skip


@pytest.mark.parametrize(
    ("state", "hours_ago", "lease_step", "says"),
    [
        ("disabled_inactivity", 1500, "success", "after 60 days without activity"),
        ("active", 30, "success", "the last scheduled run is 30 h 00 min old, more than 24 h"),
        ("active", 1, "skipped", "DIGITALOCEAN_LEASE_TOKEN is not set"),
    ],
    ids=["disabled-for-inactivity", "late", "no-secret"],
)
@pytest.mark.parametrize("command", [None, "up"], ids=["push", "wake"])
def test_every_deploy_warns_on_its_run_when_the_lease_no_longer_guards_and_deploys_anyway(
    runner: Runner, github: tuple[FakeGitHub, str], command: str | None,
    state: str, hours_ago: float, lease_step: str, says: str,
) -> None:  # fmt: skip
    """A lapsed lease is seen where the user looks (the warning on the run of their push or of a
    wake), weeks before a forgotten Droplet would need it; and it stops no deploy."""
    fake, api = github
    passed_answers, passed = a_run(40, ("test", "success"))
    fake.answers |= passed_answers | lease_answers(state, hours_ago, lease_step)
    fake.answers[runs_path()] = (200, {"total_count": 1, "workflow_runs": [passed]})
    job = ask_tested(runner, api, command)
    assert job.ran[-1] == LEASE_LOOK, job.ran
    warnings = [line for line in job.out[LEASE_LOOK].splitlines()
                if line.startswith("::warning title=lease::")]  # fmt: skip
    assert any(says in w for w in warnings), job.out[LEASE_LOOK]
    assert "Not guarding:" in job.summary
    assert job.outputs["ask"] == {"run-tests": "false"}, "the deploy goes on"
    assert which_jobs_run("false") == ["tested", "deploy"]


def test_a_lease_that_guards_gives_no_warning(
    runner: Runner, github: tuple[FakeGitHub, str]
) -> None:
    fake, api = github
    fake.answers |= lease_answers("active", 1, "success")
    fake.answers[runs_path()] = (200, {"total_count": 0, "workflow_runs": []})
    job = ask_tested(runner, api, None)
    assert "::warning" not in job.out[LEASE_LOOK], job.out[LEASE_LOOK]
    assert "The lease's schedule runs and does its work." in job.out[LEASE_LOOK]
    looked = [p for p, _, auth in fake.requests if "lease.yml" in p]
    assert looked == [f"/repos/{REPO}/actions/workflows/lease.yml",
                      f"/repos/{REPO}/actions/workflows/lease.yml/runs"]  # fmt: skip
    assert {auth for _, _, auth in fake.requests} == {"Bearer ghs-test-token"}


@pytest.mark.parametrize("workflow", ["deploy.yml", "preview.yml"])
def test_the_test_job_runs_check_whole_as_root_through_sudo(runner: Runner, workflow: str) -> None:
    runner.fake("sudo", 0)
    ctx = context("http://127.0.0.1:9", "up")
    job = Job(runner, ctx)
    proc = job.steps(load(f".github/workflows/{workflow}")["jobs"]["test"]["steps"], ctx)
    assert proc is not None and proc.returncode == 0, proc and proc.stderr
    assert runner.calls("sudo") == [
        ["-n", "true"],
        ["-n", "env", f"PATH={runner.tool}/bin:{runner.bin}", f"LD_LIBRARY_PATH={runner.tool}/lib",
         "./check"],
    ]  # fmt: skip
    runner.fake("sudo", 1, "sudo: a password is required")
    proc = job.steps(load(f".github/workflows/{workflow}")["jobs"]["test"]["steps"], ctx)
    assert proc is not None and proc.returncode == 1
    assert "the tests need root" in proc.stderr


def test_the_long_stack_scenarios_run_in_a_job_of_their_own_as_root_through_sudo(
    runner: Runner,
) -> None:
    """Issue 42: the stack_long scenarios, which ./check leaves out by default, run on every pull
    request and push in stack-long.yml: ./check whole as root (they need namespaces, nftables,
    sshd), with `-m stack_long` handed to pytest."""
    runner.fake("sudo", 0)
    ctx = context("http://127.0.0.1:9", None)
    job = Job(runner, ctx)
    wf = load(".github/workflows/stack-long.yml")
    proc = job.steps(wf["jobs"]["stack-long"]["steps"], ctx)
    assert proc is not None and proc.returncode == 0, proc and proc.stderr
    assert runner.calls("sudo") == [
        ["-n", "true"],
        ["-n", "env", f"PATH={runner.tool}/bin:{runner.bin}", f"LD_LIBRARY_PATH={runner.tool}/lib",
         "./check", "-m", "stack_long"],
    ]  # fmt: skip


def test_the_deploy_job_sets_up_as_the_runner_user_up_to_pulumi_up(runner: Runner) -> None:
    ctx = context("http://127.0.0.1:9", "up", PULUMI_STATE_BUCKET="my-state")
    job = Job(runner, ctx)
    proc = job.steps(load(".github/workflows/deploy.yml")["jobs"]["deploy"]["steps"], ctx)
    assert proc is not None and proc.returncode == 0, proc.stderr
    assert job.ran == [
        "Note when this run began", "setup-python", "Install the program and policy pack dependencies",
        "Choose the state backend", "Which platform does this stack deploy to?",
    ]  # fmt: skip
    assert job.outputs["platform"] == {"platform": "droplet"}
    # The run's start, in the form lease.py --failed-up takes (the clean-up's --since).
    began = job.outputs["began"]["at"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", began), began
    # Both venvs in the workspace, made by uid 1001, and pip asked for each requirements file.
    for venv in (runner.ws / "venv", runner.ws / "policy" / "venv"):
        assert venv.stat().st_uid == UID and (venv / "pip-installed").exists()
    assert runner.calls("pip") == [
        ["install", "--quiet", "-r", "requirements.txt"],
        ["install", "--quiet", "-r", "policy/requirements.txt"],
    ]
    url = "s3://my-state?endpoint=nyc3.digitaloceanspaces.com"
    assert job.outputs["setup"] == {"backend-url": url}
    assert job.genv["PULUMI_BACKEND_URL"] == url


@pytest.mark.parametrize(
    ("command", "status", "runs"),
    [("up", "failure", True), ("up", "cancelled", True), ("up", "success", False),
     (None, "failure", True),  # a push: no inputs, an up
     ("destroy", "failure", False)],
)  # fmt: skip
def test_the_clean_up_runs_after_a_failed_or_cancelled_up_only(
    command: str | None, status: str, runs: bool
) -> None:
    """deploy.yml's last step, its `if:` as GitHub evaluates it once `pulumi up` ended so."""
    [step] = [s for s in load(".github/workflows/deploy.yml")["jobs"]["deploy"]["steps"]
              if s.get("name") == "Delete the GPU Droplets this failed up made"]  # fmt: skip
    ctx = context("http://127.0.0.1:9", command)
    ctx["steps"] = {"began": {"outputs": {"at": "2026-12-05T03:00:00Z"}}}
    funcs = {"success": lambda: status == "success", "failure": lambda: status == "failure",
             "cancelled": lambda: status == "cancelled", "always": lambda: True}  # fmt: skip
    assert bool(Expr(condition(step), ctx, funcs).value()) is runs


def test_the_deploy_job_without_a_state_bucket_stops_before_pulumi_up(runner: Runner) -> None:
    ctx = context("http://127.0.0.1:9", "up")
    job = Job(runner, ctx)
    proc = job.steps(load(".github/workflows/deploy.yml")["jobs"]["deploy"]["steps"], ctx)
    assert proc is not None and proc.returncode == 1
    assert "::error::set the repository variable PULUMI_STATE_BUCKET" in proc.stdout


# The Pulumi CLI as the engine answers a stack whose provider kubeconfig in the state is `days`
# old: DigitalOcean's credentials expire after 7 days (kubeconfig_expire_seconds), and a read
# with the stored provider then gets 401. Which reads use the stored provider, from pulumi/pulumi:
# a refresh runs the program only with --run-program (refresh.go; up.go, "only applies if
# --refresh is set"), whose default is PULUMI_RUN_PROGRAM (sdk/go/common/env/env.go: "1" or
# "true"); a destroy runs it only so too (destroy.go, DestroyV2), and its own --refresh never
# (pkg/resource/deploy/deployment_executor.go: Refresh && !RefreshProgram, which destroy never
# sets). Each call is recorded with whether it would run the program.
FAKE_PULUMI = """#!/usr/bin/python3
import json, os, sys
argv = sys.argv[1:]
flags = [a for a in argv if a.startswith("--run-program")]
env = os.environ.get("PULUMI_RUN_PROGRAM", "").lower() in ("1", "true")
program = flags[-1] in ("--run-program", "--run-program=true") if flags else env
with open(LOG, "a") as log:
    log.write(json.dumps([argv, program]) + "\\n")
if argv[:2] == ["stack", "select"]:
    sys.exit(0)
op, refresh = argv[0], argv[0] == "refresh" or "--refresh" in argv
stored = (refresh and (op == "destroy" or not program)) or (op == "destroy" and not program)
if PLATFORM == "kubernetes" and DAYS >= 7 and stored:
    sys.exit(f"error: {op}: the kubeconfig in the state: 401 Unauthorized (DAYS days old)")
print(f"{op}: ok")
"""


def fake_pulumi(runner: Runner, platform: str, days: int) -> None:
    script = runner.bin / "pulumi"
    log = runner.root / "log" / "pulumi.jsonl"
    script.write_text(
        FAKE_PULUMI.replace("LOG", repr(str(log))).replace("PLATFORM", repr(platform))
        .replace("DAYS", str(days))
    )  # fmt: skip
    script.chmod(0o755)
    os.chown(script, UID, GID)


def pulumi_calls(runner: Runner) -> list[tuple[list[str], bool]]:
    log = runner.root / "log" / "pulumi.jsonl"
    lines = log.read_text().splitlines() if log.exists() else []
    return [(argv, program) for argv, program in map(json.loads, lines)]


UP = ["up", "--yes", "--skip-preview", "--refresh", "--policy-pack", "policy",
      "--policy-pack-config", "policy/config.json"]  # fmt: skip


@pytest.mark.parametrize("days", [1, 8])
@pytest.mark.parametrize(
    ("stack", "command", "calls", "run_program"),
    [
        # A Droplet stack: as before, one refresh-first up or destroy.
        ("dev", None, [UP], False),
        ("dev", "up", [UP], False),
        ("dev", "destroy", [["destroy", "--yes", "--skip-preview", "--refresh"]], False),
        # A Kubernetes stack: the program runs for the refresh and for the destroy.
        ("kube", "up", [UP], True),
        ("kube", "destroy", [["refresh", "--skip-preview", "--yes"],
                             ["destroy", "--yes", "--skip-preview"]], True),
    ],
    ids=["dev-push", "dev-up", "dev-destroy", "kube-up", "kube-destroy"],
)  # fmt: skip
def test_a_stack_deploys_and_destroys_any_number_of_days_after_its_last_up(
    runner: Runner, stack: str, command: str | None, calls: list[list[str]], run_program: bool,
    days: int,
) -> None:  # fmt: skip
    """Issue 43: deploy.yml's deploy job, its steps for real as uid 1001 through pulumi/actions'
    stand-in, against a fake `pulumi` that fails as the engine does a Kubernetes stack's read
    with the provider's stored kubeconfig after 7 days. Today's deploy.yml (refresh and destroy
    with the stored provider) failed the 8-day Kubernetes up and destroy."""
    platform = "kubernetes" if stack == "kube" else "droplet"
    fake_pulumi(runner, platform, days)
    ctx = context("http://127.0.0.1:9", command, PULUMI_STATE_BUCKET="my-state")
    if command:
        ctx["inputs"]["stack"] = stack
    job = Job(runner, ctx, through_pulumi=True)
    proc = job.steps(load(".github/workflows/deploy.yml")["jobs"]["deploy"]["steps"], ctx)
    assert proc is not None and proc.returncode == 0, job.out
    assert job.conclusion == "success"
    select = ["stack", "select", "--stack", stack]
    wanted = [c for call in calls for c in (select, [*call, "--stack", stack])]
    assert pulumi_calls(runner) == [(c, run_program) for c in wanted]
    assert job.outputs["platform"] == {"platform": platform}


def test_expressions_render_as_github_evaluates_them() -> None:
    ctx = {"inputs": {"stack": "", "command": "destroy"}, "vars": {}}
    assert render("deploy ${{ inputs.stack || 'dev' }} ${{ inputs.command || 'up' }}", ctx) == (
        "deploy dev destroy"
    )
    assert Expr("!(inputs.command == 'DESTROY') || 'x'", ctx).value() == "x"
    with pytest.raises(AssertionError):
        render("${{ fromJSON(inputs.stack) }}", ctx)
