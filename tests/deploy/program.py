"""Run the Pulumi program in pulumi/ under Pulumi's mocks (`pulumi.runtime.set_mocks`): no
engine, no cluster; every resource it declares is recorded with its inputs, as the
Kubernetes provider would receive them, and the stack outputs are resolved. A dynamic
resource (the program's own providers: the cluster CA and certificates, the admin key) is
created as Pulumi's provider host would: its serialized provider is deserialized (dill) and
its `create` (or, given the previous outputs, `diff` and `update`) runs for real."""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

dill = pytest.importorskip("dill", reason="needs the deploy extras: pulumi, pulumi-kubernetes (`make setup` installs them)")
pulumi = pytest.importorskip("pulumi", reason="needs the deploy extras: pulumi, pulumi-kubernetes (`make setup` installs them)")

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = ROOT / "pulumi" / "__main__.py"
PROJECT = "doq"


def load_program() -> ModuleType:
    """pulumi/__main__.py as a module (its `main()` not run)."""
    spec = importlib.util.spec_from_file_location("doq_pulumi_program", PROGRAM)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class Declared:
    token: str  # e.g. "kubernetes:apps/v1:StatefulSet"
    name: str  # Pulumi's logical name
    inputs: dict[str, Any]

    @property
    def manifest(self) -> dict[str, Any]:
        """The object as the provider sends it to the API server (numbers are ints again:
        Pulumi's wire format carries every number as a float)."""
        return _ints(self.inputs)


@dataclass(frozen=True)
class Deployment:
    resources: list[Declared]
    outputs: dict[str, Any]
    dynamic: dict[str, dict[str, Any]]  # the dynamic resources' outputs (state), by name
    updated: list[str]  # the dynamic resources this run updated (given `previous`)

    def all(self, kind: str) -> list[dict[str, Any]]:
        return [r.manifest for r in self.resources if r.token != DYNAMIC and r.manifest.get("kind") == kind]

    def one(self, kind: str, name: str | None = None) -> dict[str, Any]:
        found = [m for m in self.all(kind) if name is None or m["metadata"]["name"] == name]
        assert len(found) == 1, (kind, name, [r.name for r in self.resources])
        return found[0]

    @property
    def secrets(self) -> dict[str, dict[str, str]]:
        """Every Secret's data by name, as the pods see it."""
        return {m["metadata"]["name"]: m["stringData"] for m in self.all("Secret")}

    @property
    def pod_template(self) -> dict[str, Any]:
        return self.one("StatefulSet")["spec"]["template"]  # type: ignore[no-any-return]

    @property
    def container(self) -> dict[str, Any]:
        [c] = self.pod_template["spec"]["containers"]
        return c  # type: ignore[no-any-return]


DYNAMIC = "pulumi-python:dynamic:Resource"
_SECRET_SIG = "4dabf18193072939515e22adb298388d"  # Pulumi's wire marker of a secret value


def _plain(value: Any) -> Any:
    """A mock's inputs with secret wrappers unwrapped."""
    if isinstance(value, dict):
        if value.get(_SECRET_SIG) == "1b47061264138c4ac30d75fd1eb44270":
            return _plain(value["value"])
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


class _Mocks(pulumi.runtime.Mocks):
    def __init__(self, previous: dict[str, dict[str, Any]] | None = None) -> None:
        self.resources: list[Declared] = []
        self.previous = previous or {}  # a dynamic resource's outputs of an earlier `up`, by name
        self.dynamic: dict[str, dict[str, Any]] = {}  # their outputs now
        self.updated: list[str] = []

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        inputs = _plain(dict(args.inputs))
        if args.typ == DYNAMIC:
            provider = dill.loads(base64.b64decode(inputs.pop("__provider")))
            props = {k: v for k, v in inputs.items() if v is not None}
            old = self.previous.get(args.name)
            if old is None:
                created = provider.create(props)
                rid, outs = created.id, created.outs or {}
            else:
                rid, outs = old["__id"], {k: v for k, v in old.items() if k != "__id"}
                if provider.diff(rid, outs, props).changes:
                    outs = provider.update(rid, outs, props).outs or {}
                    self.updated.append(args.name)
            self.dynamic[args.name] = {"__id": rid, **outs}
            self.resources.append(Declared(args.typ, args.name, props))
            return rid, outs
        self.resources.append(Declared(args.typ, args.name, inputs))
        return f"{args.name}-id", inputs

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict[str, Any], None]:
        return {}, None


def deploy(config: dict[str, object] | None = None, previous: Deployment | None = None) -> Deployment:
    """Run the program with stack config `doq:<key>` = value; raises what it raises. With
    `previous`, its dynamic resources exist already (a later `pulumi up` of the stack)."""
    mocks = _Mocks(previous.dynamic if previous else None)
    # Pulumi's mocks create futures on the current event loop. After pytest-asyncio has run
    # a test in this process, the main thread has none any more: give it a fresh one.
    loop = asyncio.new_event_loop()
    loop.set_exception_handler(_drop_unretrieved)
    asyncio.set_event_loop(loop)
    pulumi.runtime.set_mocks(mocks, project=PROJECT, stack="test", preview=False)
    pulumi.runtime.set_all_config({f"{PROJECT}:{k}": str(v).lower() if isinstance(v, bool) else str(v)
                                   for k, v in (config or {}).items()})
    program = load_program()
    exported: dict[str, Any] = {}
    outputs: dict[str, Any] = {}

    @pulumi.runtime.test
    def run() -> pulumi.Output[None]:
        real_export = pulumi.export
        pulumi.export = lambda name, value: exported.__setitem__(name, value)  # type: ignore[assignment]
        try:
            declared = program.main()
        finally:
            pulumi.export = real_export  # type: ignore[assignment]
        urns = [r.urn for r in declared.values() if isinstance(r, pulumi.Resource)]
        names = list(exported)
        return pulumi.Output.all(*urns, *(exported[n] for n in names)).apply(
            lambda values: outputs.update(zip(names, values[len(urns):], strict=True)))

    run()
    return Deployment(mocks.resources, outputs, mocks.dynamic, mocks.updated)


_PULUMI_LEFTOVERS = {"Future exception was never retrieved", "Task exception was never retrieved",
                     "Task was destroyed but it is pending!"}


def _drop_unretrieved(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """A program that fails (as the refusal tests want) leaves Pulumi's sibling outputs holding
    the same exception; the loop would print each at garbage collection, long after the test,
    burying pytest's summary (a CI log's tail). `deploy` raises the failure itself, so those
    leftovers are dropped; anything else goes to the default handler."""
    if context.get("message", "") in _PULUMI_LEFTOVERS:
        return
    loop.default_exception_handler(context)


def _ints(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _ints(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_ints(v) for v in value]
    return value
