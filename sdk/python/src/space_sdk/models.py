"""The API's objects as typed dataclasses.

Each model names the schema of ``docs/openapi.json`` it mirrors (``__schema__``); a test
checks that every property of that schema is a field here, so the SDK cannot silently fall
behind the server. Fields the server does not send (an older server) take their defaults,
and properties this SDK does not know yet (a newer server) are kept in ``extra``.
"""

from __future__ import annotations

import dataclasses
import enum
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, List, Optional, Type, TypeVar, Union

__all__ = [
    "SessionState",
    "SnapshotKind",
    "FileType",
    "Resources",
    "SessionLifetime",
    "NetworkPolicy",
    "RetentionTier",
    "Retention",
    "SnapshotPolicy",
    "SessionInfo",
    "Snapshot",
    "CommandResult",
    "ProcessInfo",
    "FileInfo",
    "WriteInfo",
    "WatchEvent",
    "Template",
    "TemplateDefaults",
    "SandboxUsage",
    "DiskStats",
    "NetworkUsage",
    "SessionStats",
    "SessionEvent",
    "SessionNetwork",
    "PortAccess",
    "CreatedKey",
    "ApiKey",
    "QuotaUsage",
    "TenantQuota",
    "MODELS",
]


class SessionState(str, enum.Enum):
    """Where a session is in its life; compares equal to its string (``"running"``)."""

    CREATING = "creating"
    RUNNING = "running"
    PAUSED = "paused"
    RESTORING = "restoring"
    SUSPENDING = "suspending"
    SUSPENDED = "suspended"
    DESTROYING = "destroying"
    DESTROYED = "destroyed"
    FAILED = "failed"
    #: Its node was lost while it ran; ``resume()`` continues it (see ``Session.error``).
    INTERRUPTED = "interrupted"

    def __str__(self) -> str:
        return self.value

    @property
    def is_transitional(self) -> bool:
        return self in (SessionState.CREATING, SessionState.RESTORING, SessionState.SUSPENDING, SessionState.DESTROYING)


class SnapshotKind(str, enum.Enum):
    DISK = "disk"
    FULL = "full"

    def __str__(self) -> str:
        return self.value


class FileType(str, enum.Enum):
    FILE = "file"
    DIR = "dir"
    SYMLINK = "symlink"
    OTHER = "other"

    def __str__(self) -> str:
        return self.value


M = TypeVar("M", bound="Model")


@dataclass
class Model:
    """Base of the models: parsing from the API's JSON, and ``extra`` for unknown properties."""

    __schema__: ClassVar[str] = ""
    extra: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls: Type[M], data: Dict[str, Any]) -> M:
        hints = _hints(cls)
        known = {f.name for f in dataclasses.fields(cls) if f.name != "extra"}
        values = {name: _convert(hints[name], data[name]) for name in known if name in data}
        obj = cls(**values)
        obj.extra = {k: v for k, v in data.items() if k not in known}
        return obj

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name != "extra":
                out[f.name] = _plain(getattr(self, f.name))
        out.update(self.extra)
        return out


_HINTS: Dict[type, Dict[str, Any]] = {}


def _hints(cls: type) -> Dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _convert(hint: Any, value: Any) -> Any:
    """`value` from JSON as the annotated type (models, enums, lists, dicts, Optional)."""
    if value is None:
        return None
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is Union:
        inner = [a for a in args if a is not type(None)]
        return _convert(inner[0], value) if len(inner) == 1 else value
    if origin in (list, List):
        return [_convert(args[0], v) for v in value] if args else list(value)
    if origin in (dict, Dict):
        return {k: _convert(args[1], v) for k, v in value.items()} if args else dict(value)
    if isinstance(hint, type) and issubclass(hint, Model) and isinstance(value, dict):
        return hint.from_json(value)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        try:
            return hint(value)
        except ValueError:
            return value  # a value this SDK does not know yet (a newer server)
    return value


def _plain(value: Any) -> Any:
    if isinstance(value, Model):
        return value.to_json()
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


@dataclass
class Resources(Model):
    __schema__: ClassVar[str] = "Resources"
    cpus: float = 1.0
    memory_mib: int = 512
    pids: int = 512
    disk_mib: int = 0


@dataclass
class SessionLifetime(Model):
    __schema__: ClassVar[str] = "SessionLifetime"
    idle_timeout_secs: Optional[int] = None
    max_age_secs: Optional[int] = None
    #: ``"destroy"`` (default) or ``"suspend"``: what reaching ``max_age_secs`` does.
    on_max_age: str = "destroy"
    #: When a call resumes the suspended session (``auto_resume``), it ends this many seconds later.
    auto_resume_max_age_secs: Optional[int] = None


@dataclass
class NetworkPolicy(Model):
    """Where a session may connect to (through the node's gateway); default: nowhere."""

    __schema__: ClassVar[str] = "NetworkPolicy"
    allow: List[str] = field(default_factory=list)
    deny: List[str] = field(default_factory=list)
    ports: List[int] = field(default_factory=list)
    cidrs: List[str] = field(default_factory=list)


@dataclass
class RetentionTier(Model):
    __schema__: ClassVar[str] = "RetentionTier"
    every_s: int = 0
    for_s: int = 0


@dataclass
class Retention(Model):
    __schema__: ClassVar[str] = "Retention"
    keep_all_s: int = 0
    tiers: List[RetentionTier] = field(default_factory=list)


@dataclass
class SnapshotPolicy(Model):
    __schema__: ClassVar[str] = "SnapshotPolicy"
    disk_every_s: Optional[int] = None
    full_every_s: Optional[int] = None
    retention: Optional[Retention] = None


@dataclass
class SessionInfo(Model):
    """A session as the API describes it (``GET /v1/sessions/{id}``)."""

    __schema__: ClassVar[str] = "Session"
    id: str = ""
    template: str = ""
    state: SessionState = SessionState.CREATING
    runtime: str = "linux"
    template_version: Optional[int] = None
    resources: Resources = field(default_factory=Resources)
    env: Dict[str, str] = field(default_factory=dict)
    snapshot_policy: Optional[SnapshotPolicy] = None
    lifetime: SessionLifetime = field(default_factory=SessionLifetime)
    error: Optional[str] = None
    sandbox_id: Optional[str] = None
    created_at: int = 0
    """Unix time in milliseconds."""
    updated_at: int = 0
    name: Optional[str] = None
    labels: Dict[str, str] = field(default_factory=dict)
    metadata: Dict[str, str] = field(default_factory=dict)
    auto_resume: bool = False
    tenant: Optional[str] = None
    node: Optional[str] = None


@dataclass
class Snapshot(Model):
    __schema__: ClassVar[str] = "Snapshot"
    id: str = ""
    session_id: str = ""
    kind: SnapshotKind = SnapshotKind.DISK
    name: Optional[str] = None
    parent: Optional[str] = None
    size_bytes: Optional[int] = None
    exclusive_bytes: Optional[int] = None
    created_at: int = 0
    durable: bool = False
    outlives_session: bool = False


@dataclass
class CommandResult(Model):
    """How a command ended and what it printed (``ExecResult``)."""

    __schema__: ClassVar[str] = "ExecResult"
    pid: int = 0
    exit_code: Optional[int] = None
    """``None`` when the command was killed by a signal (see ``signal``)."""
    signal: Optional[int] = None
    timed_out: bool = False
    oom_killed: bool = False
    stdout: str = ""
    stderr: str = ""
    truncated: bool = False
    duration_ms: int = 0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@dataclass
class ProcessInfo(Model):
    __schema__: ClassVar[str] = "ProcessInfo"
    pid: int = 0
    cmd: List[str] = field(default_factory=list)
    tty: bool = False
    background: bool = False
    running: bool = False
    exit_code: Optional[int] = None
    signal: Optional[int] = None


@dataclass
class FileInfo(Model):
    __schema__: ClassVar[str] = "FileInfo"
    name: str = ""
    path: str = ""
    type: FileType = FileType.FILE
    size: int = 0
    mode: int = 0
    uid: int = 0
    gid: int = 0
    modified_ms: int = 0
    symlink_target: Optional[str] = None

    @property
    def is_dir(self) -> bool:
        return self.type == FileType.DIR


@dataclass
class WriteInfo(Model):
    __schema__: ClassVar[str] = "WriteResult"
    path: str = ""
    bytes: int = 0


@dataclass
class WatchEvent(Model):
    __schema__: ClassVar[str] = "WatchEvent"
    kind: str = ""
    """create, modify, remove, moved_from, moved_to or overflow."""
    path: str = ""
    is_dir: bool = False


@dataclass
class TemplateDefaults(Model):
    """What an OCI image's config gives the commands run from a template."""

    __schema__: ClassVar[str] = "TemplateDefaults"
    env: List[str] = field(default_factory=list)
    working_dir: Optional[str] = None
    user: Optional[str] = None
    entrypoint: List[str] = field(default_factory=list)
    cmd: List[str] = field(default_factory=list)


@dataclass
class Template(Model):
    __schema__: ClassVar[str] = "Template"
    name: str = ""
    scope: str = "global"
    """``global`` (the operator's, every tenant's to use) or ``own`` (the caller's alone)."""
    version: int = 0
    created_at: int = 0
    size_bytes: int = 0
    source: str = ""
    digest: Optional[str] = None
    """The image's digest, for templates imported from an OCI image."""
    defaults: Optional[TemplateDefaults] = None


@dataclass
class SandboxUsage(Model):
    __schema__: ClassVar[str] = "SandboxUsage"
    memory_bytes: int = 0
    memory_peak_bytes: Optional[int] = None
    memory_limit_bytes: int = 0
    oom_kills: int = 0
    pids: int = 0
    cpu_usage_ns: int = 0


@dataclass
class DiskStats(Model):
    __schema__: ClassVar[str] = "DiskStats"
    used_bytes: int = 0
    limit_bytes: Optional[int] = None
    enforced: bool = False
    snapshots: int = 0
    snapshot_bytes: int = 0


@dataclass
class NetworkUsage(Model):
    __schema__: ClassVar[str] = "NetworkUsage"
    bytes_in: int = 0
    bytes_out: int = 0


@dataclass
class SessionStats(Model):
    __schema__: ClassVar[str] = "SessionStats"
    sandbox: Optional[SandboxUsage] = None
    disk: DiskStats = field(default_factory=DiskStats)
    network: NetworkUsage = field(default_factory=NetworkUsage)


@dataclass
class SessionEvent(Model):
    __schema__: ClassVar[str] = "SessionEvent"
    seq: int = 0
    session_id: str = ""
    at: int = 0
    kind: str = ""
    from_state: Optional[SessionState] = None
    to_state: Optional[SessionState] = None
    message: Optional[str] = None


@dataclass
class SessionNetwork(Model):
    __schema__: ClassVar[str] = "SessionNetwork"
    session_id: str = ""
    policy: NetworkPolicy = field(default_factory=NetworkPolicy)
    grants: List[str] = field(default_factory=list)
    inherited: List[str] = field(default_factory=list)


@dataclass
class PortAccess(Model):
    """How a port of a session's sandbox is reached from outside (``POST …/ports/{port}``)."""

    __schema__: ClassVar[str] = "PortAccess"
    port: int = 0
    public: bool = False
    url: str = ""
    preview_url: Optional[str] = None
    token: Optional[str] = None
    """Shown only in the answer that opened the port (header ``X-Space-Port-Token``)."""
    opened_at: Optional[int] = None


@dataclass
class CreatedKey(Model):
    """A new API key; ``key`` is the secret, shown once."""

    __schema__: ClassVar[str] = "CreatedKey"
    key: str = ""
    id: str = ""
    name: Optional[str] = None
    tenant: str = ""
    tenant_id: str = ""
    created_at: int = 0
    expires_at: Optional[int] = None
    #: For a session-scoped token: ``{"session_id": ..., "scopes": [...]}``.
    scope: Optional[Dict[str, Any]] = None


@dataclass
class ApiKey(Model):
    """An API key as listed (never its secret)."""

    __schema__: ClassVar[str] = "ApiKey"
    id: str = ""
    name: Optional[str] = None
    tenant: str = ""
    tenant_id: str = ""
    admin: bool = False
    created_at: int = 0
    last_used_at: Optional[int] = None
    expires_at: Optional[int] = None
    revoked_at: Optional[int] = None
    #: For a session-scoped token: ``{"session_id": ..., "scopes": [...]}``.
    scope: Optional[Dict[str, Any]] = None


@dataclass
class QuotaUsage(Model):
    __schema__: ClassVar[str] = "QuotaUsage"
    sessions: int = 0
    cpus: float = 0.0
    memory_mib: int = 0
    disk_mib: int = 0


@dataclass
class TenantQuota(Model):
    """A tenant's limits (``None``: unlimited) and what it uses of them."""

    __schema__: ClassVar[str] = "TenantQuota"
    tenant: str = ""
    tenant_id: str = ""
    max_sessions: Optional[int] = None
    max_cpus: Optional[float] = None
    max_memory_mib: Optional[int] = None
    max_disk_mib: Optional[int] = None
    usage: QuotaUsage = field(default_factory=QuotaUsage)


MODELS: List[Type[Model]] = [
    Resources,
    SessionLifetime,
    NetworkPolicy,
    RetentionTier,
    Retention,
    SnapshotPolicy,
    SessionInfo,
    Snapshot,
    CommandResult,
    ProcessInfo,
    FileInfo,
    WriteInfo,
    WatchEvent,
    Template,
    TemplateDefaults,
    SandboxUsage,
    DiskStats,
    SessionStats,
    SessionEvent,
    SessionNetwork,
    PortAccess,
    CreatedKey,
    ApiKey,
    QuotaUsage,
    TenantQuota,
]
"""Every model, for the schema coverage test."""
