"""scripts/ci/tested.py: did this commit already pass its tests? Run as deploy.yml's `tested`
job runs it (test_runner.py's user `runner`, uid 1001, the job's steps from the YAML) against a
fake GitHub on loopback: a pass of the same commit's `test` job sends it straight to deploy, a
month of wakes does not hide it, a skip, a failure or a cancel is no pass, a GitHub that does not
answer runs the tests, a destroy waits for none; and it follows no redirect with the token.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
import script_module
from pulumi_harness import ROOT
from recorder import Recorder
from stack import github_api
from stack.github_api import GitHub
from test_clients_github import TOKEN
from test_runner import (
    BECOMING_RUNNER,
    CAN_BECOME_RUNNER,
    LEASE_LOOK,
    REPO,
    SHA,
    FakeGitHub,
    Runner,
    a_run,
    ask_tested,
    context,
    github_on_loopback,
    runner_user,
    runs_path,
    which_jobs_run,
)


@pytest.fixture
def runner() -> Iterator[Runner]:
    """test_runner.py's user `runner`; skipped where this is not root, as that file is."""
    if not CAN_BECOME_RUNNER:
        pytest.skip(BECOMING_RUNNER)
    with runner_user() as r:
        yield r


@pytest.fixture
def github() -> Iterator[tuple[FakeGitHub, str]]:
    with github_on_loopback() as served:
        yield served


@pytest.mark.parametrize("command", [None, "up"], ids=["push", "wake"])
def test_a_commit_whose_test_job_passed_before_goes_straight_to_deploy(
    runner: Runner, github: tuple[FakeGitHub, str], command: str | None
) -> None:
    fake, api = github
    failed_answers, failed = a_run(41, ("tested", "success"), ("test", "failure"))
    passed_answers, passed = a_run(
        40, ("tested", "success"), ("test", "success"), ("deploy", "failure")
    )
    fake.answers |= failed_answers | passed_answers
    fake.answers[runs_path()] = (200, {"total_count": 2, "workflow_runs": [failed, passed]})
    job = ask_tested(runner, api, command)
    assert job.outputs["ask"] == {"run-tests": "false"}
    assert "passed job `test` of deploy.yml already: https://gh/run/40" in job.summary
    # What it asked: this workflow's runs of this commit, then their jobs of every attempt.
    # (The lease's look comes after the answer: its own test below.)
    (path, query, auth), *jobs = [r for r in fake.requests if "lease.yml" not in r[0]]
    assert path == runs_path() and query["head_sha"] == [SHA] and query["event"] == ["push"]
    assert auth == "Bearer ghs-test-token"
    assert [(p, q["filter"]) for p, q, _ in jobs] == [
        (f"/repos/{REPO}/actions/runs/41/jobs", ["all"]),
        (f"/repos/{REPO}/actions/runs/40/jobs", ["all"]),
    ]
    assert which_jobs_run("false") == ["tested", "deploy"]


@pytest.fixture
def strict_github() -> Iterator[tuple[GitHub, str]]:
    """The shared fake GitHub (tests/support/stack/github_api.py: runs paged and filtered by
    head_sha and event as GitHub does, each run's jobs as deploy.yml names them)."""
    token = context("", None)["secrets"]["GITHUB_TOKEN"]  # the job's GITHUB_TOKEN
    fake = GitHub(repo=REPO, workflow="deploy.yml", token=token, head_sha=SHA)
    server = github_api.serve(fake, socket.create_server(("127.0.0.1", 0)), None)
    try:
        yield fake, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("passed_by", ["push", "wake"])
def test_a_month_of_wakes_does_not_hide_the_run_that_passed(
    runner: Runner, strict_github: tuple[GitHub, str], passed_by: str
) -> None:
    """Every wake is a run of the same commit whose `test` job is skipped. The run that passed
    is behind 150 of them (more than one page of 100): the push run is asked for first; a wake
    that ran the tests (GitHub could not tell it before) is found on the second page."""
    fake, api = strict_github
    if passed_by == "push":
        passed = fake.push()
        fake.finish_run("success", passed["id"])
    else:
        failed = fake.push()  # its tests failed; a wake ran them again and they passed
        fake.finish_run("failure", failed["id"], tested="failure")
        passed = fake.wake()
        fake.finish_run("success", passed["id"], tested="success")
    for _ in range(150):
        fake.finish_run("success", fake.wake()["id"])
    fake.head_sha = "f" * 40  # a later commit's runs are not this one's
    fake.finish_run("success", fake.push()["id"])
    job = ask_tested(runner, api, "up")
    assert job.outputs["ask"] == {"run-tests": "false"}, job.stdout
    assert f"passed job `test` of deploy.yml already: {passed['html_url']}" in job.summary
    asked_jobs = [path for path in fake.asked if path.endswith("/jobs")]
    assert asked_jobs[-1] == f"/repos/{REPO}/actions/runs/{passed['id']}/jobs", asked_jobs
    if passed_by == "push":
        assert len(asked_jobs) == 1, "only the push run's jobs"
    else:
        assert len(asked_jobs) == 152, "the failed push, then 150 wakes of two pages, then it"


@pytest.mark.parametrize(
    "earlier",
    [
        [],  # a new commit: the push's own run
        [("tested", "success"), ("test", "skipped"), ("deploy", "success")],  # no skip on a skip
        [("tested", "success"), ("test", "failure")],
        [("tested", "success"), ("test", "cancelled")],
    ],
    ids=["new", "skipped", "failed", "cancelled"],
)
def test_a_commit_without_a_passed_test_job_runs_the_tests_first(
    runner: Runner, github: tuple[FakeGitHub, str], earlier: list[tuple[str, str]]
) -> None:
    fake, api = github
    runs = []
    if earlier:
        answers, run = a_run(50, *earlier)
        fake.answers |= answers
        runs.append(run)
    other_answers, other = a_run(51, ("test", "success"), sha="f" * 40)  # another commit's pass
    fake.answers |= other_answers
    fake.answers[runs_path()] = (200, {"total_count": 2, "workflow_runs": [*runs, other]})
    job = ask_tested(runner, api, "up")
    assert job.outputs["ask"] == {"run-tests": "true"}
    assert f"/repos/{REPO}/actions/runs/51/jobs" not in [p for p, _, _ in fake.requests]
    assert which_jobs_run("true") == ["tested", "test", "deploy"]
    assert which_jobs_run("true", test_result="failure") == ["tested", "test"]
    assert which_jobs_run("true", cancelled=True) == ["tested"]
    assert which_jobs_run("", tested_result="failure") == ["tested"]


@pytest.mark.parametrize("status", [403, 500])
def test_when_github_does_not_answer_the_tests_run(
    runner: Runner, github: tuple[FakeGitHub, str], status: int
) -> None:
    fake, api = github
    fake.answers[runs_path()] = (status, {"message": "Resource not accessible by integration"})
    job = ask_tested(runner, api, "up")
    assert job.outputs["ask"] == {"run-tests": "true"}
    assert f"::warning::could not tell whether {SHA[:12]}" in job.stdout
    assert f"HTTP {status}" in job.summary


def test_a_destroy_waits_for_no_tests(runner: Runner, github: tuple[FakeGitHub, str]) -> None:
    fake, api = github
    job = ask_tested(runner, api, "destroy")
    assert job.outputs["ask"] == {"run-tests": "false"}
    assert fake.requests == []
    assert f"skipped: {LEASE_LOOK}" in job.ran, "a destroy does not look at the lease"
    assert which_jobs_run("false") == ["tested", "deploy"]


def test_tested_py_follows_no_redirect_with_the_token(
    redirect_to: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """deploy.yml's `tested` job used urllib's urlopen, which follows a 302 and sends the
    Authorization header on to wherever it points. Now the redirect is an answer: the commit
    counts as not tested (the suite runs) and the token went nowhere else."""
    tested = script_module.load(ROOT / "scripts" / "ci" / "tested.py", "tested_redirect")
    env = {"GITHUB_API_URL": redirect_to, "GITHUB_REPOSITORY": "me/llm",
           "GITHUB_SHA": "0" * 40, "GITHUB_TOKEN": TOKEN}  # fmt: skip
    args = tested.argparse.Namespace(command="up", workflow="deploy.yml", job="test")
    run_tests, why = tested.decide(args, env)
    assert run_tests and "HTTP 302" in why
    assert Recorder.seen == [], "the token followed the redirect"
    assert TOKEN not in capsys.readouterr().out + why
