"""The waker's settings: the env file the program renders (components/host/wake.py env_text)
and the unit's own Environment= (the token's credential path). Every key is required and none
has a default here: the program is the one place each value is set. A key missing, or a value
that cannot be used, stops the waker with one line that names it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from clients import transport

# Every key the waker reads: env_text renders each but WAKE_TOKEN_FILE, which the unit sets
# (a systemd credential's path); tests/test_wake_settings.py holds the lists equal.
KEYS = (
    "WAKE_LISTEN",
    "WAKE_UPSTREAMS_DIR",
    "WAKE_HOLD_FILE",
    "WAKE_TRIGGER",
    "WAKE_STACK",
    "WAKE_TOKEN_FILE",
    "WAKE_GITHUB_API",
    "WAKE_GITHUB_REPO",
    "WAKE_GITHUB_WORKFLOW",
    "WAKE_GITHUB_REF",
    "WAKE_WEBHOOK_URL",
    "WAKE_WEBHOOK_HEADER",
    "WAKE_HOLD_SECONDS",
    "WAKE_EXPECTED_SECONDS",
    "WAKE_COOLDOWN_MINUTES",
    "WAKE_MAX_PER_DAY",
    "WAKE_DEADLINE_MINUTES",
    "WAKE_STATE_FILE",
    "WAKE_HEALTH_SECONDS",
    "WAKE_COMMENT_SECONDS",
    "WAKE_ASLEEP_SECONDS",
    "WAKE_ASLEEP_LOOKS",
    "WAKE_BUSY_SECONDS",
    "WAKE_RUN_POLL_SECONDS",
    "WAKE_MAX_HELD",
    "WAKE_MAX_HELD_BYTES",
)
TRIGGERS = ("github", "webhook")


@dataclass(frozen=True)
class Settings:
    listen: tuple[str, int]
    upstreams_dir: Path
    hold_file: Path
    trigger: str  # github | webhook
    stack: str
    token: str
    github_api: str
    github_repo: str
    github_workflow: str
    github_ref: str
    webhook_url: str
    webhook_header: str
    hold_seconds: float
    expected_seconds: float
    cooldown_minutes: float
    max_per_day: int
    deadline_minutes: float
    state_file: Path | None  # none: nothing kept across a restart
    health_seconds: float
    comment_seconds: float
    asleep_seconds: float
    asleep_looks: int
    busy_seconds: float
    max_held: int
    max_held_bytes: int
    run_poll_seconds: float

    @staticmethod
    def from_env(env: dict[str, str]) -> Settings:
        missing = [key for key in KEYS if key not in env]
        if missing:
            raise SystemExit(
                f"missing setting(s) {', '.join(missing)}: the program renders every one "
                "(components/host/wake.py env_text, unit_text); run the wake phase again"
            )
        check(env)
        host, _, port = env["WAKE_LISTEN"].rpartition(":")
        token_file = env["WAKE_TOKEN_FILE"]
        state = env["WAKE_STATE_FILE"]
        return Settings(
            listen=(host or "127.0.0.1", _int(env, "WAKE_LISTEN", port)),
            upstreams_dir=Path(env["WAKE_UPSTREAMS_DIR"]),
            hold_file=Path(env["WAKE_HOLD_FILE"]),
            trigger=env["WAKE_TRIGGER"],
            stack=env["WAKE_STACK"],
            token=Path(token_file).read_text().strip() if token_file else "",
            github_api=env["WAKE_GITHUB_API"].rstrip("/"),
            github_repo=env["WAKE_GITHUB_REPO"],
            github_workflow=env["WAKE_GITHUB_WORKFLOW"],
            github_ref=env["WAKE_GITHUB_REF"],
            webhook_url=env["WAKE_WEBHOOK_URL"],
            webhook_header=env["WAKE_WEBHOOK_HEADER"],
            hold_seconds=_float(env, "WAKE_HOLD_SECONDS"),
            expected_seconds=_float(env, "WAKE_EXPECTED_SECONDS"),
            cooldown_minutes=_float(env, "WAKE_COOLDOWN_MINUTES"),
            max_per_day=_int(env, "WAKE_MAX_PER_DAY"),
            deadline_minutes=_float(env, "WAKE_DEADLINE_MINUTES"),
            state_file=Path(state) if state else None,
            health_seconds=_float(env, "WAKE_HEALTH_SECONDS"),
            comment_seconds=_float(env, "WAKE_COMMENT_SECONDS"),
            asleep_seconds=_float(env, "WAKE_ASLEEP_SECONDS"),
            asleep_looks=_int(env, "WAKE_ASLEEP_LOOKS"),
            busy_seconds=_float(env, "WAKE_BUSY_SECONDS"),
            max_held=_int(env, "WAKE_MAX_HELD"),
            max_held_bytes=_int(env, "WAKE_MAX_HELD_BYTES"),
            run_poll_seconds=_float(env, "WAKE_RUN_POLL_SECONDS"),
        )


def check(env: dict[str, str]) -> None:
    """The trigger one of TRIGGERS, a webhook never called without its secret, and the token
    sent over HTTPS only (plain HTTP to 127.0.0.1 alone: the tests' fakes), the clients' one
    rule (clients/transport.py token_url_problem), said at start rather than at a wake."""
    trigger = env["WAKE_TRIGGER"]
    if trigger not in TRIGGERS:
        raise SystemExit(f"WAKE_TRIGGER={trigger!r}: accepted: {', '.join(TRIGGERS)}")
    if trigger == "webhook" and not (env["WAKE_WEBHOOK_URL"] and env["WAKE_WEBHOOK_HEADER"]):
        # The program sets both (WakeConfig).
        raise SystemExit("WAKE_TRIGGER=webhook needs WAKE_WEBHOOK_URL and WAKE_WEBHOOK_HEADER")
    for url_key in ("WAKE_GITHUB_API", "WAKE_WEBHOOK_URL"):
        if env[url_key] and (problem := transport.token_url_problem(env[url_key])):
            raise SystemExit(f"{url_key}: {problem}")


def _int(env: dict[str, str], key: str, text: str | None = None) -> int:
    value = env[key] if text is None else text
    try:
        return int(value)
    except ValueError:
        raise SystemExit(f"{key}={env[key]!r}: not a whole number") from None


def _float(env: dict[str, str], key: str) -> float:
    try:
        return float(env[key])
    except ValueError:
        raise SystemExit(f"{key}={env[key]!r}: not a number") from None
