"""Request bodies and query parameters of the session calls, shared by both clients."""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from ._wire import Duration, seconds
from .errors import BadRequestError
from .models import NetworkPolicy, SessionInfo, SessionState, Snapshot, SnapshotKind, SnapshotPolicy

SnapshotRef = Union[Snapshot, str]
Labels = Union[Mapping[str, str], Iterable[str], None]

CREATE_FIELDS = {
    # CreateSessionRequest property -> the Session.create argument that sets it
    "template": "template",
    "runtime": "runtime",
    "cpus": "cpus",
    "memory_mib": "memory_mib",
    "pids": "pids",
    "disk_mib": "disk_mib",
    "env": "env",
    "snapshot_policy": "snapshot_policy",
    "idle_timeout_secs": "idle_timeout",
    "max_age_secs": "max_age",
    "on_max_age": "on_max_age",
    "auto_resume_max_age_secs": "auto_resume_max_age",
    "network": "network (and allow=)",
    "grants": "grants",
    "name": "name",
    "labels": "labels",
    "metadata": "metadata",
    "auto_resume": "auto_resume",
}
"""Every property of ``CreateSessionRequest`` and the argument of ``Session.create`` that sets
it (checked against docs/openapi.json by the tests)."""

UPDATE_FIELDS = {
    "snapshot_policy": "snapshot_policy",
    "idle_timeout_secs": "idle_timeout",
    "max_age_secs": "max_age",
    "on_max_age": "on_max_age",
    "auto_resume_max_age_secs": "auto_resume_max_age",
    "name": "name",
    "labels": "labels",
    "metadata": "metadata",
    "auto_resume": "auto_resume",
}
"""Every property of ``UpdateSessionRequest`` and the argument of ``Session.update``."""

EXEC_FIELDS = {
    "cmd": "cmd",
    "env": "env",
    "cwd": "cwd",
    "uid": "user",
    "gid": "user",
    "stdin": "stdin",
    "timeout_ms": "timeout",
    "background": "background",
    "tty": "pty.create(size=)",
}
"""Every property of ``ExecRequest`` and ``ExecStart`` and what sets it in ``commands.run``."""


def _policy(value: Union[SnapshotPolicy, Mapping[str, Any], None]) -> Optional[Dict[str, Any]]:
    if value is None:
        return None
    return value.to_json() if isinstance(value, SnapshotPolicy) else dict(value)


def create_body(
    *,
    template: Optional[str],
    runtime: Optional[str],
    allow: Optional[Sequence[str]],
    network: Union[NetworkPolicy, Mapping[str, Any], None],
    grants: Optional[Sequence[str]],
    env: Optional[Mapping[str, str]],
    idle_timeout: Duration,
    max_age: Duration,
    on_max_age: Optional[str] = None,
    auto_resume_max_age: Union[Duration, int] = None,
    cpus: Optional[float],
    memory_mib: Optional[int],
    pids: Optional[int],
    disk_mib: Optional[int],
    snapshot_policy: Union[SnapshotPolicy, Mapping[str, Any], None],
    name: Optional[str],
    labels: Optional[Mapping[str, str]],
    metadata: Optional[Mapping[str, str]],
    auto_resume: Optional[bool],
) -> Dict[str, Any]:
    """A ``CreateSessionRequest``: only what was given, so an older server is not sent
    properties it does not know."""
    body: Dict[str, Any] = {}
    net: Optional[Dict[str, Any]] = None
    if network is not None:
        net = network.to_json() if isinstance(network, NetworkPolicy) else dict(network)
        net.pop("extra", None)
    if allow:
        net = net or {}
        net["allow"] = list(net.get("allow", [])) + list(allow)
    values = {
        "template": template,
        "runtime": runtime,
        "cpus": cpus,
        "memory_mib": memory_mib,
        "pids": pids,
        "disk_mib": disk_mib,
        "env": {str(k): str(v) for k, v in env.items()} if env else None,
        "snapshot_policy": _policy(snapshot_policy),
        "idle_timeout_secs": seconds(idle_timeout, "idle_timeout"),
        "max_age_secs": seconds(max_age, "max_age"),
        "on_max_age": on_max_age,
        "auto_resume_max_age_secs": seconds(auto_resume_max_age, "auto_resume_max_age"),
        "network": net,
        "grants": list(grants) if grants else None,
        "name": name,
        "labels": dict(labels) if labels is not None else None,
        "metadata": dict(metadata) if metadata is not None else None,
        "auto_resume": auto_resume,
    }
    body.update({k: v for k, v in values.items() if v is not None})
    return body


def update_body(
    *,
    idle_timeout: Union[Duration, int],
    max_age: Union[Duration, int],
    on_max_age: Optional[str] = None,
    auto_resume_max_age: Union[Duration, int] = None,
    snapshot_policy: Union[SnapshotPolicy, Mapping[str, Any], None],
    name: Optional[str],
    labels: Optional[Mapping[str, str]],
    metadata: Optional[Mapping[str, str]],
    auto_resume: Optional[bool],
) -> Dict[str, Any]:
    """An ``UpdateSessionRequest``; a timeout of ``0`` turns it off."""

    def secs(value: Any, what: str) -> Optional[int]:
        return 0 if value == 0 else seconds(value, what)

    values = {
        "idle_timeout_secs": secs(idle_timeout, "idle_timeout"),
        "max_age_secs": secs(max_age, "max_age"),
        "on_max_age": on_max_age,
        "auto_resume_max_age_secs": secs(auto_resume_max_age, "auto_resume_max_age"),
        "snapshot_policy": _policy(snapshot_policy),
        "name": name,
        "labels": dict(labels) if labels is not None else None,
        "metadata": dict(metadata) if metadata is not None else None,
        "auto_resume": auto_resume,
    }
    body = {k: v for k, v in values.items() if v is not None}
    if not body:
        raise BadRequestError(
            "nothing to update: pass idle_timeout, max_age, name, labels, metadata, ...", code="bad_request"
        )
    return body


def label_pairs(labels: Labels) -> List[Tuple[str, str]]:
    """``{"team": "x"}`` or ``["team=x"]`` as (key, value) pairs."""
    if labels is None:
        return []
    if isinstance(labels, Mapping):
        return [(str(k), str(v)) for k, v in labels.items()]
    pairs = []
    for item in labels:
        key, sep, value = item.partition("=")
        if not sep:
            raise BadRequestError(f"a label filter is KEY=VALUE, got {item!r}", code="bad_request")
        pairs.append((key, value))
    return pairs


def list_params(
    *, labels: Labels, state: Union[str, SessionState, None], template: Optional[str], all: bool, all_tenants: bool
) -> List[Tuple[str, str]]:
    params = [("label", f"{k}={v}") for k, v in label_pairs(labels)]
    if state is not None:
        params.append(("state", str(state)))
    if template is not None:
        params.append(("template", template))
    if all:
        params.append(("all", "true"))
    if all_tenants:
        params.append(("all_tenants", "true"))
    return params


def filter_sessions(
    sessions: List[SessionInfo], *, labels: Labels, state: Union[str, SessionState, None], template: Optional[str]
) -> List[SessionInfo]:
    """The filters applied again here: a server older than them ignores the query and
    answers with every session, and a caller acting on the list (destroying it, say) must
    not get more than it asked for."""
    pairs = label_pairs(labels)
    out = []
    for info in sessions:
        if state is not None and str(info.state) != str(state):
            continue
        if template is not None and info.template != template:
            continue
        if any(info.labels.get(k) != v for k, v in pairs):
            continue
        out.append(info)
    return out


def snapshot_id(snapshot: SnapshotRef) -> str:
    return snapshot.id if isinstance(snapshot, Snapshot) else str(snapshot)


def snapshot_body(
    kind: Union[str, SnapshotKind], name: Optional[str], outlives_session: bool = False
) -> Dict[str, Any]:
    body: Dict[str, Any] = {"kind": str(kind)}
    if name is not None:
        body["name"] = name
    if outlives_session:
        body["outlives_session"] = True
    return body


def fork_body(count: int, from_snapshot: Optional[SnapshotRef]) -> Dict[str, Any]:
    body: Dict[str, Any] = {"count": int(count)}
    if from_snapshot is not None:
        body["from"] = snapshot_id(from_snapshot)
    return body


def network_update(
    *,
    allow: Optional[Sequence[str]],
    deny: Optional[Sequence[str]],
    ports: Optional[Sequence[int]],
    cidrs: Optional[Sequence[str]],
    detached: Optional[bool],
) -> Dict[str, Any]:
    values = {
        "allow": list(allow) if allow is not None else None,
        "deny": list(deny) if deny is not None else None,
        "ports": list(ports) if ports is not None else None,
        "cidrs": list(cidrs) if cidrs is not None else None,
        "detached": detached,
    }
    return {k: v for k, v in values.items() if v is not None}


def port_url(base: str, session_id: str, port: int, path: str = "") -> str:
    return f"{base}/v1/sessions/{session_id}/ports/{int(port)}/{path.lstrip('/')}"
