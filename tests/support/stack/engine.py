"""The stack emulation's engine: the program's own `pulumi up`, carried out step by step.

`__main__.py` runs under Pulumi's mocks with the real SDKs, as the program tests do, but the mock
monitor here is an engine: each RegisterResource the SDK sends is decided (same, update, replace,
create) against the emulated stack's state and carried out by a provider before the SDK is
answered, the way the Pulumi engine answers only once a step is done. Nothing is rebuilt from the
config: what runs is what the program registered, with its inputs, dependencies and options.

The Pulumi semantics relied on, with their sources (pulumi/pulumi at v3, pulumi-command at 010bd8e):

- Order and parallelism come from the SDK: a resource is registered once its inputs resolved and
  its `depends_on` resources' URNs did, and a URN resolves when its registration is answered
  (sdk/python/lib/pulumi/runtime/resource.py: `_prepare_resource`, `do_register`). The SDK sends
  registrations from its executor's threads (`run_in_executor`), so independent steps run in
  parallel here as in a real deployment.
- The step for a registration (pkg/resource/deploy/step_generator.go, `generateSteps`): no old
  state: create; a changed property the provider says forces a new resource, or one named in
  `replaceOnChanges`: replace; another changed input: update; else same (no provider call).
- A replacement creates the new resource, then deletes the old one once the deployment's other
  steps are done (`DeleteReplaced`, scheduled with the deletes), unless `deleteBeforeReplace`: then
  the old one and the dependents that would be replaced with it go first
  (`calculateDependentReplacements`): here, a dependent whose replace-forcing inputs hold the old
  resource's id or one of its output strings.
- Resources in the state that the program no longer registers are deleted after the program ends,
  dependents before what they depend on (`GenerateDeletes`, `ScheduleDeletes`). `retainOnDelete`
  drops a resource from the state without a provider delete.
- pulumi-command's remote Command (provider/pkg/provider/remote/commandController.go): Create runs
  `create`; Update runs `update`, or `create` when there is none; Delete runs `delete` when set;
  `triggers` is replaceOnChanges (provider/pkg/provider/common/inputs.go); every other input change
  (the stdin, the connection) is an update.
- `pulumi refresh` reads each resource from its provider and drops the ones it reports gone
  (pkg/resource/deploy/step.go, `RefreshStep.Apply`: a Read that finds no resource removes it
  from the state); the others keep their inputs and take the outputs read. pulumi-command's Command has no Read
  (provider/pkg/provider/remote/commandController.go: Create, Update, Delete only), so its
  state is kept as it is.
- An `import_` id adopts a resource the account already has (no create); once the resource is in the
  state the id is ignored (step_generator.go, isImport).

A failed step fails the `up`: its error names the resource, and what registered after it waits on
it no more (the SDK's dependents never resolve; the run ends with the error). The steps already
in flight finish and are recorded before the `up` returns, as Pulumi's do.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from google.protobuf import json_format
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime import rpc
from pulumi.runtime.proto import resource_pb2
from pulumi.runtime.sync_await import _ensure_event_loop, _sync_await

SECRET_SIG = "4dabf18193072939515e22adb298388d"
SECRET_VALUE = "1b47061264138c4ac30d75fd1eb44270"


def plain(value: Any) -> Any:
    """A wire-form property value with its secret markers taken off."""
    if isinstance(value, dict):
        if value.get(SECRET_SIG) == SECRET_VALUE:
            return plain(value.get("value"))
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


@dataclass
class Resource:
    """One resource as the stack's state holds it."""

    urn: str
    type: str
    name: str
    id: str
    inputs: dict[str, Any]
    outputs: dict[str, Any]
    dependencies: set[str] = field(default_factory=set)
    delete_before_replace: bool = False
    replace_on_changes: tuple[str, ...] = ()
    retain_on_delete: bool = False


class Provider(Protocol):
    """What carries a step out for one kind of resource (a DigitalOcean type, a Command)."""

    def force_new(self, type_: str) -> frozenset[str]:
        """The input keys whose change replaces the resource (the provider's ForceNew)."""

    def create(self, new: Resource) -> tuple[str, dict[str, Any]]:
        """Make it; return its id and outputs."""

    def update(self, old: Resource, new: Resource) -> dict[str, Any]:
        """Change it in place; return its outputs."""

    def delete(self, old: Resource) -> None: ...

    def read(self, new: Resource, import_id: str) -> dict[str, Any]:
        """Adopt what the account already has under `import_id`; return its outputs."""

    def refresh(self, old: Resource) -> dict[str, Any] | None:
        """`pulumi refresh`: its outputs as they are now; None when it no longer exists."""


@dataclass
class Step:
    """One thing the engine did, for the run's summary and the tests."""

    op: str  # create, update, replace, delete, same, import
    urn: str
    type: str
    started: float
    seconds: float
    changed: tuple[str, ...] = ()  # an update's or replace's inputs that changed: why it ran


class StepError(Exception):
    """A provider failed a step: which resource, which operation, and what it said."""

    def __init__(self, op: str, resource: Resource, error: BaseException) -> None:
        self.op, self.resource, self.error = op, resource, error
        super().__init__(f"{op} {resource.type} {resource.name!r} failed: {error}")


def changed_keys(old: dict[str, Any], new: dict[str, Any]) -> set[str]:
    return {k for k in old.keys() | new.keys() if old.get(k) != new.get(k)}


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)
    elif isinstance(value, float) and value.is_integer():
        yield str(int(value))  # protobuf's numbers arrive as floats: an id 424242001.0
    elif isinstance(value, str | int) and not isinstance(value, bool):
        yield str(value)


class Engine(pulumi_mocks.MockMonitor):
    """The mock monitor that carries each registration out against `state` (urn -> Resource)
    with the provider `providers` names for its type (the longest matching type prefix)."""

    def __init__(
        self,
        mocks: pulumi_mocks.Mocks,
        providers: dict[str, Provider],
        state: dict[str, Resource],
    ) -> None:
        super().__init__(mocks)
        self.providers = providers
        self.state = state
        self.registered: set[str] = set()
        self.steps: list[Step] = []
        # Old resources replaced create-before-delete: deleted with the other deletes.
        self.replaced: list[Resource] = []
        self.lock = threading.Lock()
        # Registrations being carried out: an up ends only once none is (Pulumi lets the steps
        # in flight finish when another fails, and records them).
        self.inflight = 0
        self.settled = threading.Condition()

    # ---- the SDK's side ---------------------------------------------------------------------

    def RegisterResource(self, request: Any) -> Any:  # noqa: N802 (the monitor's gRPC name)
        urn = self.make_urn(request.parent, request.type, request.name)
        if request.type == "pulumi:pulumi:Stack" or not request.custom:
            # Component resources are the program's grouping: nothing to carry out.
            return resource_pb2.RegisterResourceResponse(urn=urn)
        _ensure_event_loop()  # as the stock monitor does: deserializing needs a loop
        new = Resource(
            urn=urn,
            type=request.type,
            name=request.name,
            id="",
            inputs=plain(json_format.MessageToDict(request.object)),
            outputs={},
            dependencies=set(request.dependencies),
            delete_before_replace=request.deleteBeforeReplace,
            replace_on_changes=tuple(request.replaceOnChanges),
            retain_on_delete=request.retainOnDelete,
        )
        with self.lock:
            self.registered.add(urn)
        with self.settled:
            self.inflight += 1
        try:
            done = self.step(new, request.importId)
        finally:
            with self.settled:
                self.inflight -= 1
                self.settled.notify_all()
        state = _sync_await(rpc.serialize_properties(done.outputs, {}))
        return resource_pb2.RegisterResourceResponse(urn=urn, id=done.id, object=state)

    # ---- the engine's side ------------------------------------------------------------------

    def provider(self, type_: str) -> Provider:
        matches = [prefix for prefix in self.providers if type_.startswith(prefix)]
        if not matches:
            raise AssertionError(f"no emulated provider for {type_}")
        return self.providers[max(matches, key=len)]

    def step(self, new: Resource, import_id: str = "") -> Resource:
        """Decide and carry out the step for `new`; record it in the state."""
        old = self.state.get(new.urn)
        provider = self.provider(new.type)
        if old is None:
            op = "import" if import_id else "create"
            self._run(op, new, lambda: self._create(provider, new, import_id))
        else:
            changed = changed_keys(old.inputs, new.inputs)
            forcing = changed & (provider.force_new(new.type) | set(new.replace_on_changes))
            if forcing:
                self._replace(provider, old, new)
            elif changed:
                new.id = old.id
                self._run("update", new, lambda: self._update(provider, old, new), changed)
            else:
                new.id, new.outputs = old.id, old.outputs
                self._record("same", new, time.time(), 0.0)
        with self.lock:
            self.state[new.urn] = new
        return new

    def _create(self, provider: Provider, new: Resource, import_id: str) -> None:
        if import_id:
            new.id, new.outputs = import_id, provider.read(new, import_id)
        else:
            new.id, new.outputs = provider.create(new)

    def _update(self, provider: Provider, old: Resource, new: Resource) -> None:
        new.outputs = provider.update(old, new)

    def _replace(self, provider: Provider, old: Resource, new: Resource) -> None:
        if new.delete_before_replace:
            for dependent in self.dependent_replacements(old):
                self._delete(dependent)
            self._delete(old)
        else:
            with self.lock:
                self.replaced.append(old)
        self._run("replace", new, lambda: self._create(provider, new, ""))

    def dependent_replacements(self, old: Resource) -> list[Resource]:
        """What must go before `old` is deleted first: the resources whose replace-forcing
        inputs hold its id or one of its output strings (so its replacement replaces them),
        and theirs, dependents first."""
        marks = {old.id, *(s for s in _strings(old.outputs) if len(s) > 3)}
        found: list[Resource] = []
        for res in list(self.state.values()):
            if old.urn not in res.dependencies or res.urn == old.urn:
                continue
            provider = self.provider(res.type)
            keys = provider.force_new(res.type) | set(res.replace_on_changes)
            values = {s for k in keys for s in _strings(res.inputs.get(k))}
            if values & marks:
                found.extend(self.dependent_replacements(res))
                found.append(res)
        return list({r.urn: r for r in found}.values())

    def _delete(self, old: Resource) -> None:
        with self.lock:
            if self.state.get(old.urn) is not old:
                return  # gone already (a dependent of two replaced resources)
            del self.state[old.urn]
        if old.retain_on_delete:
            self._record("retain", old, time.time(), 0.0)
            return
        self._run("delete", old, lambda: self.provider(old.type).delete(old))

    def wait_settled(self, timeout: float = 7200) -> None:
        """Until no registration is being carried out (the steps in flight when one failed)."""
        with self.settled:
            self.settled.wait_for(lambda: self.inflight == 0, timeout=timeout)

    def finish(self) -> None:
        """After the program: delete what it no longer registers and the old halves of
        create-before-delete replacements, dependents first."""
        gone = [r for urn, r in self.state.items() if urn not in self.registered]
        for old in delete_order([*gone, *self.replaced]):
            if old not in self.replaced:
                self._delete(old)
            elif old.retain_on_delete:  # a replaced resource marked retain is left, as Pulumi does
                self._record("retain", old, time.time(), 0.0)
            else:
                self._run("delete", old, lambda o=old: self.provider(o.type).delete(o))  # type: ignore[misc]
        self.replaced.clear()

    def _run(
        self, op: str, res: Resource, action: Callable[[], None], changed: Iterable[str] = ()
    ) -> None:
        started = time.time()
        try:
            action()
        except StepError:
            raise
        except Exception as err:
            raise StepError(op, res, err) from err
        self._record(op, res, started, time.time() - started, changed)

    def _record(
        self,
        op: str,
        res: Resource,
        started: float,
        seconds: float,
        changed: Iterable[str] = (),
    ) -> None:
        with self.lock:
            self.steps.append(Step(op, res.urn, res.type, started, seconds, tuple(sorted(changed))))


def delete_order(resources: Iterable[Resource]) -> list[Resource]:
    """Dependents before what they depend on (a reverse topological order)."""
    pending = {r.urn: r for r in resources}
    order: list[Resource] = []
    while pending:
        leaves = [
            r
            for r in pending.values()
            if not any(r.urn in other.dependencies for other in pending.values() if other is not r)
        ]
        if not leaves:  # a cycle cannot happen in a Pulumi state; take what is left as it is
            leaves = list(pending.values())
        for r in sorted(leaves, key=lambda r: r.urn):
            order.append(r)
            del pending[r.urn]
    return order
