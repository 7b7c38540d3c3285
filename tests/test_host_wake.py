"""components/host/wake.py: what the program renders for the front's waker (its settings, its
unit), the routes the gateway's Caddyfile adds for it, and the `wake` output. The waker itself
(scripts/phases/wake/) is test_wake.py's and test_wake_*.py's; the wake phase under bash,
test_pool_scripts.py's; those routes in the real Caddy, test_gateway.py's and test_wake.py's."""

from __future__ import annotations

import json

from pulumi_harness import run_program, stack_config
from test_droplet import dev
from test_entry import WAKE

from components.host import wake
from components.spec import catalog, config

TOKEN = "github_pat_HOSTwakeTEST00000000000000000000000"


def waking(**section: object) -> config.StackConfig:
    raw = stack_config("dev")
    raw["wake"] = {"enabled": True, "githubRepo": "me/llm", "token": TOKEN, **section}
    return config.parse(raw, "dev", frozenset({"wake"}))


def test_a_webhook_trigger_shows_only_its_origin_in_the_output() -> None:
    hook = {**WAKE, "trigger": "webhook", "webhookUrl": "https://ci.example.com:8443/h?t=s3cr3t"}
    run = run_program({**dev(), "replicas": 2}, secrets={"wake": json.dumps(hook)})
    assert run.error is None, run.error
    assert run.outputs["wake"].value["trigger"] == "webhook: https://ci.example.com:8443"
    assert "s3cr3t" not in json.dumps(run.outputs["wake"].value)


def test_the_settings_name_no_secret_and_the_unit_reads_the_token_as_a_credential() -> None:
    """The env file holds every setting but the token: the unit hands the token's file to the
    waker as a systemd credential; the waker listens on the front's loopback alone."""
    env = wake.env_text(waking())
    assert TOKEN not in env + wake.unit_text()
    rendered = dict(line.split("=", 1) for line in env.splitlines())
    assert len(rendered) == len(env.splitlines()), "one KEY=value a line, each key once"
    assert all(key.startswith("WAKE_") for key in rendered)
    assert "WAKE_TOKEN_FILE" not in rendered
    assert rendered["WAKE_LISTEN"] == wake.ADDRESS and wake.ADDRESS.startswith("127.0.0.1:")
    assert rendered["WAKE_GITHUB_REPO"] == "me/llm" and rendered["WAKE_STACK"] == "dev"
    unit = wake.unit_text().splitlines()
    assert f"LoadCredential=token:{wake.TOKEN_FILE}" in unit
    assert "Environment=WAKE_TOKEN_FILE=%d/token" in unit
    assert f"EnvironmentFile={wake.ENV_FILE}" in unit and "DynamicUser=yes" in unit
    assert f"ExecStart={wake.PYTHON} -P -m {wake.PACKAGE}" in unit
    assert f"Environment=PYTHONPATH={wake.PACKAGE_DIR.rsplit('/', 1)[0]}" in unit


def test_a_held_request_goes_to_the_waker_only_while_its_hold_file_exists() -> None:
    """Caddy's `file` matcher looks for the hold file under its folder; the replicas' own route
    is the fallback, indented into its block as given."""
    route = wake.held("reverse_proxy 10.0.0.2:8080 {\n\tlb_policy least_conn\n}",
                      waker="127.0.0.1:9999", hold_file="/run/x/hold")  # fmt: skip
    assert "@held file {\n\troot /run/x\n\ttry_files /hold\n}\nhandle @held {\n" in route
    assert "\treverse_proxy 127.0.0.1:9999 {\n" in route
    assert route.endswith(
        "handle {\n\treverse_proxy 10.0.0.2:8080 {\n\t\tlb_policy least_conn\n\t}\n}"
    )
    assert wake.held("x").startswith(f"@held file {{\n\troot {wake.HOLD_DIR}\n")


def test_the_control_route_takes_get_and_post_on_its_path_with_the_key_alone() -> None:
    route = wake.control_routes("127.0.0.1:9999")
    assert f"{{http.request.uri}} == '{wake.CONTROL_PATH}'" in route
    assert "{http.request.method} in ['GET', 'POST']" in route
    keyed = route.index("handle @authorized {")
    assert route.index("reverse_proxy 127.0.0.1:9999") > keyed
    assert 'respond "unauthorized: send one Authorization: Bearer <apiKey> header" 401' in route


def test_the_wake_output_says_the_trigger_the_guards_and_what_sleeping_costs() -> None:
    raw = stack_config("dev")
    assert wake.output(config.parse(raw, "dev"), 0.04, 5.0) == {"mode": "off"}
    out = wake.output(waking(maxPerDay=3, cooldownMinutes=20), 0.04, 5.0)
    front = round(0.04 * catalog.HOURS_PER_BILLING_MONTH, 2)
    assert out["mode"] == "on" and out["trigger"] == "github: me/llm deploy.yml@main"
    assert (out["maxPerDay"], out["cooldownMinutes"]) == (3, 20)
    assert out["idleMonthlyPriceUsd"] == round(front + 5.0, 2)
    assert out["idleCost"].startswith(f"${front:.2f}/month the front")
    assert "+ $5.00/month the cache Volumes" in out["idleCost"]
    assert out["state"] == "nemodrop wake --stack dev"
    assert TOKEN not in json.dumps(out)
