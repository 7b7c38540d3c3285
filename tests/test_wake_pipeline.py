"""scripts/phases/wake/pipeline.py, the waker's pipeline client, against the strict fake GitHub on
loopback (tests/support/stack/github_api.py): the dispatch and its run found by id or by title,
a failed run's job log read WITHOUT the token on its signed redirect, the program's refusal and
the clean-up's billing lines read from that log, and no redirect followed with the token or the
webhook's secret. tests/test_wake.py runs the same pipeline through the whole daemon."""

from __future__ import annotations

import dataclasses
import re
import socket
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, ClassVar

import loopback
import pytest
import script_module
from stack import github_api
from test_wake import FAILED_UP_LOG, REFUSED_LOG, WAKE_SOURCE, FakeGitHub
from test_wake_settings import rendered

WAKER = Path(__file__).resolve().parent.parent / "scripts" / "phases" / "wake"
pipeline: Any = script_module.load_package(WAKER, "wake_pipeline_test", "pipeline").pipeline
TOKEN = "github_pat_PIPELINEtestTOKEN0000000000000000000"
SECRET = "webhook-secret-PIPELINE-0000"


@pytest.fixture
def github() -> Iterator[tuple[FakeGitHub, str]]:
    """The fake GitHub for me/llm's deploy.yml and the one token, and its URL."""
    fake = FakeGitHub(token=TOKEN)
    server = github_api.serve(fake, socket.create_server(("127.0.0.1", 0)), None)
    yield fake, loopback.url(server)
    loopback.stop(server)


def made(tmp_path: Path, api: str, **env: str) -> Any:
    """A Pipeline with the program's settings, this API and the token in its credential file."""
    token = tmp_path / "token"
    token.write_text((SECRET if env.get("WAKE_TRIGGER") == "webhook" else TOKEN) + "\n")
    values = {**rendered(), "WAKE_TOKEN_FILE": str(token), "WAKE_GITHUB_API": api,
              "WAKE_GITHUB_REPO": "me/llm", "WAKE_GITHUB_WORKFLOW": "deploy.yml",
              "WAKE_STACK": "dev", "WAKE_RUN_POLL_SECONDS": "0.05", **env}  # fmt: skip
    settings = pipeline.Settings.from_env(values)
    return pipeline.Pipeline(settings)


def test_a_dispatch_gives_its_run_and_an_older_githubs_run_is_found_by_its_title(
    tmp_path: Path, github: tuple[FakeGitHub, str]
) -> None:
    """GitHub answers a dispatch with return_run_details with the run's id; one that predates
    it (422 naming the key) is sent the dispatch again without it (204), and the run is then
    found by deploy.yml's run-name among the runs created since."""
    fake, url = github
    p = made(tmp_path, url)
    run_id = p.dispatch_github()
    assert run_id == fake.runs[-1]["id"]
    assert fake.dispatches == [{"ref": "main", "inputs": {"stack": "dev", "command": "up",
                                                          "refresh": "true"}}]  # fmt: skip
    fake.old = True
    assert p.dispatch_github() is None
    assert len(fake.dispatches) == 2, "the 422 queued nothing; its retry did"
    found = p.find_run(pipeline._epoch(fake.runs[-1]["created_at"]))
    assert found is not None and found["id"] == fake.runs[-1]["id"] != run_id
    assert found["display_title"].startswith("deploy dev ")


def test_a_refused_dispatch_says_githubs_status_and_why(
    tmp_path: Path, github: tuple[FakeGitHub, str]
) -> None:
    _, url = github
    p = made(tmp_path, url)
    wrong_token = "github_pat_WRONG"  # not the fake GitHub's: refused
    wrong = dataclasses.replace(p, s=dataclasses.replace(p.s, token=wrong_token))
    with pytest.raises(pipeline.PipelineError, match=r"HTTP 401: the token was refused"):
        wrong.dispatch_github()
    with pytest.raises(pipeline.PipelineError, match=r"HTTP 422: the workflow refused.*No ref"):
        made(tmp_path, url, WAKE_GITHUB_REF="gone").dispatch_github()
    with pytest.raises(pipeline.PipelineError, match=r"HTTP 404: no such repository"):
        made(tmp_path, url, WAKE_GITHUB_REPO="me/other").dispatch_github()
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    with pytest.raises(pipeline.PipelineError, match=r"could not be reached: URLError"):
        made(tmp_path, f"http://127.0.0.1:{port}").dispatch_github()


def test_a_failed_runs_job_log_is_read_without_the_token_on_its_signed_redirect(
    tmp_path: Path, github: tuple[FakeGitHub, str]
) -> None:
    """GitHub answers GET .../jobs/{id}/logs with a 302 to a storage URL signed for a minute,
    which refuses a request that carries the token (the fake's storage answers 403 then): the
    log comes back only when the Location is fetched without it. Its refusal and billing lines
    name why the run failed and what still bills."""
    fake, url = github
    p = made(tmp_path, url)
    p.dispatch_github()
    fake.finish_run("failure", log=REFUSED_LOG + FAILED_UP_LOG[-2:])
    run = fake.runs[-1]
    why = p.failure_of({"id": run["id"]})
    assert why.startswith(" in job deploy, step Run pulumi/actions@v7 (the stack was refused: "
                          "droplet.size: gpu-h100x1-80gb is not offered in nyc2 today"), why  # fmt: skip
    assert why.endswith("; billing: the failed up of stack dev made 1 GPU Droplet(s); 1 deleted "
                        "($3.39/h stopped); nemotron-dev (7, $3.39/h): made by this run: "
                        "deleted"), why  # fmt: skip
    assert fake.signed, "asked through GitHub's redirect"
    assert any(path.startswith("/_storage/logs/") for path in fake.asked)
    for fault in ("expired", "storage-refuses", "no-log-yet", "cut"):
        fake.log_fault = fault
        text = p.job_log(run["_jobs"][-1]["id"])
        assert "nothing was created" not in text, fault


def test_the_refusal_and_billing_lines_are_read_from_a_log_of_any_shape() -> None:
    stamp = "2027-01-15T08:15:00.0000000Z "
    log = "\ufeff" + "".join(stamp + line + "\n" for line in REFUSED_LOG + FAILED_UP_LOG)
    assert pipeline.refusal_in_log(log) == [
        "droplet.size: gpu-h100x1-80gb is not offered in nyc2 today, where this stack's front "
        "Droplet 7 (nemotron-dev-lb) stay (offered in: tor1); wait and wake or up again"
    ]
    assert pipeline.billing_in_log(log) == [
        "the failed up of stack dev made 1 GPU Droplet(s); 1 deleted ($3.39/h stopped)",
        "nemotron-dev (7, $3.39/h): made by this run: deleted",
    ]
    assert pipeline.refusal_in_log("nothing was created:\n") == []
    assert pipeline.refusal_in_log("a\nb\n" * 1000) == []
    many = "x: nothing was created:\n" + "".join(f"  - f{i}: bad\n" for i in range(9))
    assert pipeline.refusal_in_log(many) == [f"f{i}: bad" for i in range(5)], "five at most"
    assert pipeline.billing_in_log("billing: " + "x" * 1000) == ["x" * 300]


def test_the_tokens_expiry_is_read_from_githubs_header() -> None:
    assert pipeline.token_expiry("2027-10-12 09:00:00 UTC") == 1823331600.0
    assert pipeline.token_expiry("2027-10-12 11:00:00 +0200") == 1823331600.0
    assert pipeline.token_expiry("soon") is None and pipeline.token_expiry(None) is None


class Redirects(BaseHTTPRequestHandler):
    """Every request answered with a redirect of `status` to `to` (another loopback port)."""

    status = 302
    to = ""

    def _answer(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(self.status)
        self.send_header("Location", f"{self.to}{self.path}")
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = _answer  # noqa: N815 (http.server's names)

    def log_message(self, *_: Any) -> None:
        pass


class Records(BaseHTTPRequestHandler):
    """What reaches the redirect's target: each request's headers."""

    seen: ClassVar[list[dict[str, str]]] = []

    def _answer(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).seen.append(dict(self.headers))
        loopback.reply(self, 200, b'{"state": "active", "workflow_run_id": 1}', "application/json")

    do_GET = do_POST = _answer  # noqa: N815 (http.server's names)

    def log_message(self, *_: Any) -> None:
        pass


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_no_redirect_is_followed_with_the_token_or_the_webhooks_secret(
    tmp_path: Path, status: int
) -> None:
    """An API or webhook that answers with a redirect (a repository renamed, a moved hook) is
    an answer, never followed: urllib's urlopen, which the waker used, sends every header on to
    the Location (a GET's 3xx, and a POST's 301/302/303 as a GET), the token with it. Failed on
    the waker's own urllib code (the target got the token for a check, a ref lookup, a run's
    look and a dispatch or webhook redirected by 301, 302 or 303); passes through the clients."""
    target = loopback.serve(type("Target", (Records,), {"seen": []}))
    redirect = loopback.serve(type("Redirect", (Redirects,), {"status": status,
                                                               "to": loopback.url(target)}))  # fmt: skip
    try:
        p = made(tmp_path, loopback.url(redirect))
        assert p.check_pipeline()["warning"] == f"GitHub answered HTTP {status}"
        assert p.ref_missing() is False
        with pytest.raises(pipeline.PipelineError, match=rf"HTTP {status}"):
            p.dispatch_github()
        assert p.find_run(0.0) is None and p.recent_runs() is None
        hook = made(tmp_path, loopback.url(redirect), WAKE_TRIGGER="webhook",
                    WAKE_WEBHOOK_URL=f"{loopback.url(redirect)}/hook")  # fmt: skip
        with pytest.raises(pipeline.PipelineError, match=rf"the webhook refused .*HTTP {status}"):
            hook.call_webhook()
        seen = target.RequestHandlerClass.seen  # type: ignore[attr-defined]
        assert seen == [], "nothing reached the redirect's target"
    finally:
        loopback.stop(redirect)
        loopback.stop(target)


def test_the_fields_the_waker_reads_are_the_ones_githubs_description_requires() -> None:
    """The REST description (tests/support/stack/github_api_schema.json, extracted from
    github/rest-api-description): the run fields, query parameters and dispatch keys the waker
    uses are ones GitHub documents, so the strict fake's answers are GitHub's shape."""
    described = github_api.schema()
    waker = WAKE_SOURCE
    read = set(re.findall(r'run\.get\("(\w+)"', waker)) | set(
        re.findall(r'found\.get\("(\w+)"', waker)
    )
    assert read and read <= set(described["workflow_run_required"]), read
    # Each URL's query against its own operation: a workflow's runs, a run's jobs.
    urls = re.findall(r'"((?:workflows/\{[^}]+\}/)?runs[^"?]*)\?([^"]+)"', waker)
    assert len(urls) == 3, urls  # the runs by title, the runs of the group, a run's jobs
    for url, query in urls:
        names = set(re.findall(r"(?:^|&)(\w+)=", query))
        allowed = "jobs_list" if url.endswith("/jobs") else "runs_list"
        assert names <= set(described[f"{allowed}_query_parameters"]), (url, names)
    assert "filter" in described["jobs_list_query_parameters"]
    assert "latest" in described["jobs_list_filter_enum"]
    # A job: the fields the waker reads are required of every job; its log is a redirect.
    # (`steps` is not required of a job: the waker reads it as `.get("steps") or []`.)
    job_fields = set(re.findall(r"""(?:\bj|failed\[0\])\.get\(["'](\w+)["']""", waker))
    assert 'get("steps") or []' in waker
    assert {"conclusion", "name", "steps"} <= job_fields, job_fields
    assert job_fields - {"steps"} <= set(described["job_required"]), job_fields
    assert described["job_logs"]["responses"] == ["302"]
    sent = set(
        re.findall(
            r'^\s+"(\w+)": ',
            waker[waker.index("def dispatch_github") : waker.index("    def check_pipeline")],
            re.M,
        )
    )
    assert sent == set(described["dispatch_request"]["properties"]), sent
    assert "workflow_run_id" in described["dispatch_response_200_required"]
