"""The running stack's configuration as the Pulumi engine passes it: the one place the config
meets Pulumi.

spec/config.py parses and validates and knows nothing of Pulumi; `load()` here reads this
stack's keys from the engine and hands them to it. A refusal, of the config or of what the
account has (a size not sold, a Volume held elsewhere, a zone not managed), reaches the engine
as a StackConfigError: spec's ConfigError and Pulumi's RunError both, so the tests catch it as
the one and `pulumi up` prints its message alone (no traceback) before anything is declared.
"""

from __future__ import annotations

import json
from typing import Any

import pulumi
import pulumi_random as random

from ..spec import config
from ..spec.schema import NAMESPACE, SECRET_KEYS, StackConfig


class StackConfigError(config.ConfigError, pulumi.RunError):
    """Bad stack configuration, as the engine reports it: the problems, one a line."""


def load() -> StackConfig:
    """Read and validate this stack's configuration; raise StackConfigError on any problem."""
    keys = set(pulumi.runtime.config.CONFIG.get()) | set(pulumi.runtime.get_config_env())
    problems = config.namespace_problems(keys)
    if problems:
        raise StackConfigError(problems)
    raw, secret, values = _raw_from_pulumi()
    try:
        return config.parse(raw, pulumi.get_stack(), secret, values)
    except config.ConfigError as err:
        raise StackConfigError(err.problems) from None


def _raw_from_pulumi() -> tuple[dict[str, Any], frozenset[str], dict[str, str]]:
    """Every key of our namespace that the engine passed, decoded like Config.get_object; the
    secret top-level keys' plain text apart, for checking their form only."""
    prefix = f"{NAMESPACE}:"
    keys = set(pulumi.runtime.config.CONFIG.get()) | set(pulumi.runtime.get_config_env())
    raw: dict[str, Any] = {}
    secret: set[str] = set()
    values: dict[str, str] = {}
    env_secret = set(pulumi.runtime.get_config_secret_keys_env())
    for full_key in sorted(k for k in keys if k.startswith(prefix)):
        key = full_key[len(prefix) :]
        text = pulumi.runtime.get_config(full_key)
        if pulumi.runtime.is_config_secret(full_key) or full_key in env_secret:
            secret.add(key)
        if key in SECRET_KEYS:
            raw[key] = "<secret>"
            if text is not None:
                values[key] = text
            continue
        try:
            raw[key] = json.loads(text)
        except (TypeError, json.JSONDecodeError):
            raw[key] = text
    return raw, frozenset(secret), values


def hf_token() -> pulumi.Output[str] | None:
    """The optional Hugging Face token, always as a secret Output."""
    return pulumi.Config(NAMESPACE).get_secret("hfToken")


def api_key() -> pulumi.Output[str] | None:
    """The API key given in the config (secret), or None to generate one."""
    return pulumi.Config(NAMESPACE).get_secret("apiKey")


def api_key_or_new() -> pulumi.Output[str]:
    """The key every request needs, a secret: given in the config, or made once per stack.
    Each platform asks for it after its own refusals, so a refused stack declares nothing."""
    return pulumi.Output.secret(
        api_key() or random.RandomPassword("api-key", length=48, special=False).result
    )
