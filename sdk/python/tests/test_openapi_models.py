"""The SDK's types against ``docs/openapi.json``: every property of every schema the SDK
models is a field of its model, every request property has an argument that sets it, every
error code has its exception, and every endpoint is used (or listed as left out on purpose).
When the API grows, these fail until the SDK follows."""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
from pathlib import Path
from typing import Any, Dict, Set

import pytest

import space_sdk
from space_sdk import AsyncSession, Session
from space_sdk._requests import CREATE_FIELDS, EXEC_FIELDS, UPDATE_FIELDS
from space_sdk.errors import CODE_CLASSES
from space_sdk.models import MODELS

DOC = Path(os.environ.get("SPACE_OPENAPI", Path(__file__).resolve().parents[3] / "docs" / "openapi.json"))

# Schemas modelled ahead of the document: issue 15's additions (ports, keys, quotas) and the
# WebSocket messages, which the document does not describe yet. Once it has them they are
# checked like the rest.
AHEAD_OF_THE_DOCUMENT: set = set()

# Every operation of the document, to what calls it in the SDK (sync class.attribute path;
# the async twin is checked by test_the_async_client_has_the_sync_surface). Entries ahead of
# the document (issue 15's additions) are allowed.
OPERATIONS = {
    ("GET", "/v1/health"): "Client.health",
    ("GET", "/v1/status"): "Client.status",
    ("GET", "/v1/templates"): "Client.templates",
    ("POST", "/v1/keys"): "Keys.create",
    ("GET", "/v1/keys"): "Keys.list",
    ("DELETE", "/v1/keys/{id}"): "Keys.revoke",
    ("POST", "/v1/keys/{id}/rotate"): "Keys.rotate",
    ("GET", "/v1/tenants/{tenant}/quota"): "Quotas.get",
    ("PUT", "/v1/tenants/{tenant}/quota"): "Quotas.set",
    ("GET", "/v1/sessions"): "Session.list",
    ("POST", "/v1/sessions"): "Session.create",
    ("GET", "/v1/sessions/{id}"): "Session.refresh",
    ("DELETE", "/v1/sessions/{id}"): "Session.destroy",
    ("PATCH", "/v1/sessions/{id}"): "Session.update",
    ("GET", "/v1/sessions/{id}/events"): "Session.events",
    ("GET", "/v1/sessions/{id}/stats"): "Session.stats",
    ("POST", "/v1/sessions/{id}/tokens"): "Session.create_token",
    ("POST", "/v1/sessions/{id}/pause"): "Session.pause",
    ("POST", "/v1/sessions/{id}/resume"): "Session.resume",
    ("POST", "/v1/sessions/{id}/suspend"): "Session.suspend",
    ("GET", "/v1/sessions/{id}/snapshots"): "Session.snapshots",
    ("POST", "/v1/sessions/{id}/snapshots"): "Session.snapshot",
    ("GET", "/v1/sessions/{id}/snapshots/{snapshot}"): "Session.get_snapshot",
    ("DELETE", "/v1/sessions/{id}/snapshots/{snapshot}"): "Session.delete_snapshot",
    ("POST", "/v1/sessions/{id}/restore"): "Session.restore",
    ("POST", "/v1/sessions/{id}/fork"): "Session.fork",
    ("POST", "/v1/sessions/{id}/exec"): "Commands.run",
    ("GET", "/v1/sessions/{id}/exec/ws"): "Commands.run",
    ("GET", "/v1/sessions/{id}/processes"): "Commands.list",
    ("POST", "/v1/sessions/{id}/processes/{pid}/signal"): "Commands.kill",
    ("GET", "/v1/sessions/{id}/processes/{pid}/attach"): "Commands.connect",
    ("GET", "/v1/sessions/{id}/files/content"): "Files.read",
    ("PUT", "/v1/sessions/{id}/files/content"): "Files.write",
    ("GET", "/v1/sessions/{id}/files/list"): "Files.list",
    ("GET", "/v1/sessions/{id}/files/stat"): "Files.stat",
    ("POST", "/v1/sessions/{id}/files/mkdir"): "Files.mkdir",
    ("POST", "/v1/sessions/{id}/files/move"): "Files.move",
    ("DELETE", "/v1/sessions/{id}/files"): "Files.remove",
    ("GET", "/v1/sessions/{id}/watch"): "Files.watch",
    ("GET", "/v1/sessions/{id}/network"): "Network.get",
    ("PATCH", "/v1/sessions/{id}/network"): "Network.update",
    ("POST", "/v1/sessions/{id}/grants"): "Network.grant",
    ("DELETE", "/v1/sessions/{id}/grants/{name}"): "Network.revoke",
    ("GET", "/v1/sessions/{id}/audit"): "Network.audit",
    ("GET", "/v1/sessions/{id}/ports"): "Ports.list",
    ("POST", "/v1/sessions/{id}/ports/{port}"): "Ports.expose",
    ("GET", "/v1/sessions/{id}/ports/{port}"): "Ports.get",
    ("DELETE", "/v1/sessions/{id}/ports/{port}"): "Ports.close",
}

# Paths the SDK leaves to the CLI and operators on purpose (server set-up, making and deleting templates, the
# blob store, credentials, OAuth sign-ins and tenant keys, the raw proxy and tunnel, metrics).
NOT_IN_THE_SDK = (
    "/v1/operations/",
    "/v1/pool",
    "/v1/nodes",
    "/v1/blobs/",
    "/v1/templates/import",
    "/v1/templates/build",
    "/v1/templates/uploads",
    "/v1/templates/{name}",
    "/v1/credentials",
    "/v1/tenants/{tenant}/key",
    "/v1/oauth/callback",
    "/v1/openapi.json",
    "/metrics",
    "/v1/metrics",
    "/v1/sessions/{id}/tunnel/",
    "/v1/sessions/{id}/ports/{port}/",
)


@pytest.fixture(scope="module")
def schemas() -> Dict[str, Any]:
    assert DOC.is_file(), f"{DOC} is missing (set SPACE_OPENAPI to the document's path)"
    return json.loads(DOC.read_text())["components"]["schemas"]


@pytest.fixture(scope="module")
def document() -> Dict[str, Any]:
    return json.loads(DOC.read_text())


def properties(schema: Dict[str, Any]) -> Set[str]:
    props = set(schema.get("properties", {}))
    for part in schema.get("allOf", []):
        props |= set(part.get("properties", {}))
    return props


def test_every_model_covers_its_schema(schemas):
    for model in MODELS:
        name = model.__schema__
        if name not in schemas:
            assert name in AHEAD_OF_THE_DOCUMENT, f"{model.__name__} names schema {name}, which the document lacks"
            continue
        fields = {f.name for f in dataclasses.fields(model)} - {"extra"}
        missing = properties(schemas[name]) - fields
        assert not missing, (
            f"{model.__name__} lacks {sorted(missing)} of schema {name}: add them to space_sdk/models.py"
        )


def test_the_modelled_schemas_are_the_ones_the_sdk_returns(schemas):
    modelled = {m.__schema__ for m in MODELS}
    for name in [
        "Session",
        "Snapshot",
        "ExecResult",
        "ProcessInfo",
        "FileInfo",
        "WriteResult",
        "WatchEvent",
        "SessionStats",
    ]:
        assert name in modelled


def parameters(function: Any) -> Set[str]:
    return set(inspect.signature(function).parameters)


def test_every_create_property_has_an_argument(schemas):
    props = properties(schemas["CreateSessionRequest"])
    unmapped = props - set(CREATE_FIELDS)
    assert not unmapped, f"Session.create cannot set {sorted(unmapped)} of CreateSessionRequest"
    for create in (Session.create, AsyncSession.create):
        args = parameters(create)
        for prop in props:
            arg = CREATE_FIELDS[prop].split()[0]
            assert arg in args, f"{create.__qualname__} has no argument {arg} for {prop}"


def test_every_update_property_has_an_argument(schemas):
    props = properties(schemas["UpdateSessionRequest"])
    unmapped = props - set(UPDATE_FIELDS)
    assert not unmapped, f"Session.update cannot set {sorted(unmapped)} of UpdateSessionRequest"
    for update in (Session.update, AsyncSession.update):
        args = parameters(update)
        for prop in props:
            assert UPDATE_FIELDS[prop] in args, f"{update.__qualname__} lacks {UPDATE_FIELDS[prop]} for {prop}"


def test_every_exec_property_has_an_argument(schemas):
    props = properties(schemas["ExecRequest"]) | properties(schemas.get("ExecStart", {}))
    unmapped = props - set(EXEC_FIELDS)
    assert not unmapped, f"commands.run cannot set {sorted(unmapped)} of ExecRequest/ExecStart"
    run_args = parameters(space_sdk.Commands.run) | parameters(space_sdk.AsyncCommands.run)
    for prop in props:
        arg = EXEC_FIELDS[prop]
        assert arg in run_args or "." in arg, f"commands.run lacks {arg} for {prop}"


def test_every_error_code_has_its_exception(schemas):
    codes = set(schemas["ErrorCode"]["enum"])
    missing = codes - set(CODE_CLASSES)
    assert not missing, f"no exception class for codes {sorted(missing)}: add them to space_sdk/errors.py"


def test_the_exit_message_is_read_whole(schemas):
    variants = schemas.get("WsServerMessage", {"oneOf": [{"properties": {"type": {"enum": ["exit"]}}}]})["oneOf"]
    exit_variant = next(v for v in variants if "exit" in json.dumps(v.get("properties", {}).get("type", {})))
    read = {"type"} | {f.name for f in dataclasses.fields(space_sdk.CommandResult)}
    assert properties(exit_variant) <= read, properties(exit_variant) - read


def test_every_endpoint_is_used_or_left_out_on_purpose(document):
    methods = {"get", "put", "post", "patch", "delete"}
    operations = {(m.upper(), p) for p, ops in document["paths"].items() for m in ops if m in methods}
    left_out = {(m, p) for m, p in operations if p.startswith(NOT_IN_THE_SDK)}
    unused = operations - set(OPERATIONS) - left_out
    assert not unused, f"operations the SDK does not call: {sorted(unused)} (add them, or to NOT_IN_THE_SDK)"
    for (method, path), target in OPERATIONS.items():
        cls, attribute = target.split(".")
        assert callable(getattr(getattr(space_sdk, cls), attribute, None)), f"{method} {path}: no {target}"


def public(cls: type) -> Dict[str, Any]:
    return {name: member for name, member in inspect.getmembers(cls) if not name.startswith("_") and callable(member)}


@pytest.mark.parametrize(
    "sync, async_",
    [
        (space_sdk.Session, space_sdk.AsyncSession),
        (space_sdk.Client, space_sdk.AsyncClient),
        (space_sdk.Commands, space_sdk.AsyncCommands),
        (space_sdk.CommandHandle, space_sdk.AsyncCommandHandle),
        (space_sdk.Files, space_sdk.AsyncFiles),
        (space_sdk.Pty, space_sdk.AsyncPty),
        (space_sdk.PtyHandle, space_sdk.AsyncPtyHandle),
        (space_sdk.Ports, space_sdk.AsyncPorts),
        (space_sdk.Network, space_sdk.AsyncNetwork),
        (space_sdk.Watcher, space_sdk.AsyncWatcher),
        (space_sdk.Keys, space_sdk.AsyncKeys),
        (space_sdk.Quotas, space_sdk.AsyncQuotas),
    ],
)
def test_the_async_client_has_the_sync_surface(sync, async_):
    sync_members, async_members = public(sync), public(async_)
    missing = set(sync_members) - set(async_members)
    assert not missing, f"{async_.__name__} lacks {sorted(missing)}"
    for name, member in sync_members.items():
        try:
            expected, actual = parameters(member), parameters(async_members[name])
        except (TypeError, ValueError):
            continue
        assert expected == actual, f"{async_.__name__}.{name} takes {sorted(actual)}, the sync one {sorted(expected)}"
