"""A stack as the emulation keeps it: its state across `up`s, `up` and `destroy` (engine.py does
each step; the providers carry them out)."""

from __future__ import annotations

import gc
import json
import logging
import runpy
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime import settings as pulumi_settings

from stack.engine import Engine, Provider, Resource, Step, StepError, delete_order

ROOT = Path(__file__).resolve().parent.parent.parent.parent
PROJECT = "nemotron-droplet"


@dataclass
class Result:
    """What one `up` did: its steps in order, the stack's outputs, and the error that ended it."""

    steps: list[Step]
    outputs: dict[str, Any] = field(default_factory=dict)
    error: BaseException | None = None

    def ops(self, op: str, type_: str = "") -> list[str]:
        """The names (URN tails) of the resources that had `op`, in the order they ended."""
        return [s.urn.rsplit("::", 1)[1] for s in self.steps if s.op == op and type_ in s.type]

    @property
    def failed(self) -> StepError | None:
        return self.error if isinstance(self.error, StepError) else None


class Stack:
    """One stack's state, deployed by the real program (`__main__.py`) through `providers`;
    `cloud` answers the program's invokes (the sizes, the Droplets that exist, ...)."""

    def __init__(self, name: str, providers: dict[str, Provider], cloud: pulumi_mocks.Mocks):
        self.name = name
        self.providers = providers
        self.cloud = cloud
        self.state: dict[str, Resource] = {}

    def up(self, config: dict[str, Any], secrets: dict[str, str] | None = None) -> Result:
        """`pulumi up` with this config (keys without the namespace)."""
        engine = Engine(self.cloud, self.providers, self.state)
        pulumi_settings.ROOT.set(None)
        pulumi.runtime.set_mocks(
            self.cloud, project=PROJECT, stack=self.name, preview=False, monitor=engine
        )
        values = {
            f"{PROJECT}:{k}": v if isinstance(v, str) else json.dumps(v) for k, v in config.items()
        }
        values.update({f"{PROJECT}:{k}": v for k, v in (secrets or {}).items()})
        pulumi.runtime.set_all_config(values, [f"{PROJECT}:{k}" for k in secrets or {}])
        result = Result(steps=engine.steps)

        @pulumi.runtime.test
        def program() -> pulumi.Output[None]:
            runpy.run_path(str(ROOT / "__main__.py"), run_name="__main__")
            exported: dict[str, Any] = getattr(pulumi_settings.get_root_resource(), "outputs", {})

            async def resolve() -> None:
                for name, value in exported.items():
                    result.outputs[name] = await pulumi.Output.from_input(value).future()

            return pulumi.Output.from_input(resolve())

        try:
            program()
            engine.finish()
        except BaseException as err:  # noqa: BLE001 (the up's outcome, reported to the test)
            result.error = _root_cause(err)
        finally:
            engine.wait_settled()
            gc.collect()  # most unretrieved futures are logged now (and dropped: see below)
        return result

    def refresh(self) -> Result:
        """`pulumi refresh`: each resource read back from the account (engine.py); what is gone
        leaves the state (a "delete" step with no provider call), what changed is updated."""
        engine = Engine(self.cloud, self.providers, self.state)
        result = Result(steps=engine.steps)
        for res in list(self.state.values()):
            started = time.time()
            outputs = engine.provider(res.type).refresh(res)
            if outputs is None:
                del self.state[res.urn]
                engine._record("refresh-delete", res, started, time.time() - started)
            elif outputs != res.outputs:
                res.outputs = outputs
                engine._record("refresh-update", res, started, time.time() - started)
        return result

    def destroy(self) -> Result:
        """`pulumi destroy`: every resource, dependents first (retained ones left alone)."""
        engine = Engine(self.cloud, self.providers, self.state)
        result = Result(steps=engine.steps)
        try:
            for old in delete_order(list(self.state.values())):
                engine._delete(old)
        except StepError as err:
            result.error = err
        return result


class _ReportedStepErrors(logging.Filter):
    """A failed step leaves the SDK's futures of what depended on it unretrieved, and asyncio
    logs each when it is collected ("Future exception was never retrieved"), now or at the
    process's exit. That error is the up's result, reported once: drop those records (and only
    those: any other asyncio error still shows)."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return error is None or not isinstance(_root_cause(error), StepError)


logging.getLogger("asyncio").addFilter(_ReportedStepErrors())


def _root_cause(err: BaseException) -> BaseException:
    """The step that failed, out of the SDK's wrapping (an RPC error around the monitor's)."""
    seen: BaseException | None = err
    visited: set[int] = set()
    while seen is not None and id(seen) not in visited:
        if isinstance(seen, StepError):
            return seen
        visited.add(id(seen))
        seen = seen.__cause__ or seen.__context__
    return err
