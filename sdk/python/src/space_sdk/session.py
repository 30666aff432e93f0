"""The sync client: :class:`Client` (a server and a key) and :class:`Session`."""

from __future__ import annotations

import threading
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import httpx

from . import _requests as rq
from ._config import resolve
from ._transport import SyncTransport, idempotency_headers
from ._wire import Duration, User, parse_user
from .admin import Keys, Quotas
from .commands import Commands
from .errors import BadRequestError, NotFoundError, TimeoutError
from .files import Files
from .models import (
    CreatedKey,
    NetworkPolicy,
    PortAccess,
    SessionEvent,
    SessionInfo,
    SessionNetwork,
    SessionState,
    SessionStats,
    Snapshot,
    SnapshotKind,
    SnapshotPolicy,
    Template,
)
from .pty import Pty


class Client:
    """A space server and the API key to use there, over one pool of connections.

    ``url`` defaults to ``SPACE_URL`` (else ``http://127.0.0.1:7070``), ``api_key`` to
    ``SPACE_API_KEY``. Sessions made without a client share one made for them, closed with
    the last of them."""

    def __init__(
        self,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        *,
        request_timeout: Optional[float] = None,
        http_client: Optional[httpx.Client] = None,
    ) -> None:
        self.config = resolve(url, api_key, request_timeout)
        self._transport = SyncTransport(self.config, http_client)
        self._users = 0
        self._implicit = False
        self.keys = Keys(self)
        """API keys (creating them needs the admin key)."""
        self.quotas = Quotas(self)
        """Tenant quotas (admin)."""
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return self.config.url

    def close(self) -> None:
        self._transport.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _retain(self) -> None:
        with self._lock:
            self._users += 1

    def _release(self) -> None:
        with self._lock:
            self._users -= 1
            last = self._users <= 0
        if last and self._implicit:
            self.close()

    def health(self) -> bool:
        return self._transport.request("GET", "/v1/health").status_code == 200

    def status(self) -> Dict[str, Any]:
        """The node's status: version, sessions by state, templates, pool, runtimes."""
        return self._transport.json("GET", "/v1/status")

    def templates(self) -> List[Template]:
        return [Template.from_json(t) for t in self._transport.json("GET", "/v1/templates")["templates"]]

    def create_session(self, template: Optional[str] = None, **kwargs: Any) -> "Session":
        return Session.create(template, client=self, **kwargs)

    def connect_session(self, session_id: str, **kwargs: Any) -> "Session":
        return Session.connect(session_id, client=self, **kwargs)

    def list_sessions(self, **kwargs: Any) -> List[SessionInfo]:
        return Session.list(client=self, **kwargs)


def _client(
    client: Optional[Client], url: Optional[str], api_key: Optional[str], request_timeout: Optional[float]
) -> Client:
    if client is not None:
        return client
    made = Client(url, api_key, request_timeout=request_timeout)
    made._implicit = True
    return made


def _transitional(state: Any) -> bool:
    return isinstance(state, SessionState) and state.is_transitional


class Ports:
    """``session.ports``: reaching servers that listen inside the sandbox."""

    def __init__(self, session: "Session") -> None:
        self._session = session
        self._preview: Dict[int, str] = {}

    def url(self, port: int, path: str = "") -> str:
        """Where ``port`` is reached from outside: the preview URL once :meth:`expose` gave
        one (a server with ``--preview-domain``), else the API's proxy path
        ``{server}/v1/sessions/{id}/ports/{port}/`` (send the API key, or the port's token)."""
        if int(port) in self._preview:
            return self._preview[int(port)].rstrip("/") + "/" + path.lstrip("/")
        return rq.port_url(self._session._client.url, self._session.id, port, path)

    @property
    def headers(self) -> Dict[str, str]:
        """The header that authorizes a request through the proxy (the API key)."""
        return {"Authorization": f"Bearer {self._session._client.config.api_key}"}

    def expose(self, port: int, *, public: bool = False) -> PortAccess:
        """Opens ``port`` for access by its token (or by anyone, ``public=True``)."""
        data = self._session._transport.json(
            "POST", f"{self._session._path}/ports/{int(port)}", json={"public": public}
        )
        access = PortAccess.from_json(data)
        if access.preview_url:
            self._preview[int(port)] = access.preview_url
        return access

    def get(self, port: int) -> PortAccess:
        """How ``port`` is reached now (opened or not; a token is shown only by ``expose``)."""
        return PortAccess.from_json(self._session._transport.json("GET", f"{self._session._path}/ports/{int(port)}"))

    def list(self) -> List[PortAccess]:
        """The session's opened ports."""
        return [
            PortAccess.from_json(p)
            for p in self._session._transport.json("GET", f"{self._session._path}/ports")["ports"]
        ]

    def close(self, port: int) -> None:
        """Withdraws the token and public access of ``port`` (the API key still works)."""
        self._session._transport.request("DELETE", f"{self._session._path}/ports/{int(port)}")
        self._preview.pop(int(port), None)


class Network:
    """``session.network``: the session's egress policy and credential grants."""

    def __init__(self, session: "Session") -> None:
        self._session = session

    def get(self) -> SessionNetwork:
        return SessionNetwork.from_json(self._session._transport.json("GET", f"{self._session._path}/network"))

    def update(
        self,
        *,
        allow: Optional[Sequence[str]] = None,
        deny: Optional[Sequence[str]] = None,
        ports: Optional[Sequence[int]] = None,
        cidrs: Optional[Sequence[str]] = None,
        detached: Optional[bool] = None,
    ) -> SessionNetwork:
        """Allows or denies host patterns (applied to new connections at once); ``ports`` and
        ``cidrs`` replace their lists."""
        body = rq.network_update(allow=allow, deny=deny, ports=ports, cidrs=cidrs, detached=detached)
        return SessionNetwork.from_json(
            self._session._transport.json("PATCH", f"{self._session._path}/network", json=body)
        )

    def grant(self, credential: str) -> SessionNetwork:
        data = self._session._transport.json("POST", f"{self._session._path}/grants", json={"credential": credential})
        return SessionNetwork.from_json(data)

    def revoke(self, credential: str) -> SessionNetwork:
        return SessionNetwork.from_json(
            self._session._transport.json("DELETE", f"{self._session._path}/grants/{credential}")
        )

    def audit(self, limit: Optional[int] = None) -> List[Dict[str, Any]]:
        params = {"limit": limit} if limit is not None else None
        return self._session._transport.json("GET", f"{self._session._path}/audit", params=params)["events"]


class Session:
    """A durable sandbox session: run commands, move files, snapshot, restore and fork.

    Make one with :meth:`create` (or :meth:`connect` to an existing one). Used as a context
    manager, a created session is destroyed when the block ends unless ``keep=True``."""

    def __init__(self, info: SessionInfo, client: Client, *, keep: bool = False) -> None:
        self.info = info
        self._client = client
        self._transport = client._transport
        self.keep = keep
        """When ``True``, leaving a ``with`` block leaves the session running."""
        self._closed = False
        self._uids: Dict[str, Tuple[int, Optional[int]]] = {}
        client._retain()
        self.commands = Commands(self)
        self.files = Files(self)
        self.pty = Pty(self)
        self.ports = Ports(self)
        self.network = Network(self)

    @property
    def id(self) -> str:
        return self.info.id

    @property
    def state(self) -> SessionState:
        """The state when last seen (:meth:`refresh` asks the server)."""
        return self.info.state

    @property
    def _path(self) -> str:
        return f"/v1/sessions/{self.id}"

    def __repr__(self) -> str:
        return f"<Session {self.id} {self.info.state} template={self.info.template!r}>"

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            if not self.keep:
                self.destroy()
        finally:
            self.close()

    def close(self) -> None:
        """Lets go of the connection (the session itself keeps running)."""
        if not self._closed:
            self._closed = True
            self.commands._close()
            self._client._release()

    # --- making and finding sessions -------------------------------------------------------

    @classmethod
    def create(
        cls,
        template: Optional[str] = None,
        *,
        runtime: Optional[str] = None,
        allow: Optional[Sequence[str]] = None,
        network: Union[NetworkPolicy, Mapping[str, Any], None] = None,
        grants: Optional[Sequence[str]] = None,
        env: Optional[Mapping[str, str]] = None,
        idle_timeout: Duration = None,
        max_age: Duration = None,
        on_max_age: Optional[str] = None,
        auto_resume_max_age: Union[Duration, int] = None,
        cpus: Optional[float] = None,
        memory_mib: Optional[int] = None,
        pids: Optional[int] = None,
        disk_mib: Optional[int] = None,
        snapshot_policy: Union[SnapshotPolicy, Mapping[str, Any], None] = None,
        name: Optional[str] = None,
        labels: Optional[Mapping[str, str]] = None,
        metadata: Optional[Mapping[str, str]] = None,
        auto_resume: Optional[bool] = None,
        keep: bool = False,
        client: Optional[Client] = None,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        request_timeout: Optional[float] = None,
    ) -> "Session":
        """Creates a session and waits until it runs.

        ``template`` defaults to the server's; ``allow`` lists hosts it may reach
        (``"pypi.org"``, ``"*.github.com"``; default: none); ``grants`` names credentials it
        may use; ``idle_timeout`` (seconds or ``timedelta``) suspends it when idle;
        ``auto_resume`` wakes it on the next call after that, and ``auto_resume_max_age`` then
        ends it (or with ``on_max_age="suspend"`` suspends it again) that long after."""
        body = rq.create_body(
            template=template,
            runtime=runtime,
            allow=allow,
            network=network,
            grants=grants,
            env=env,
            idle_timeout=idle_timeout,
            max_age=max_age,
            on_max_age=on_max_age,
            auto_resume_max_age=auto_resume_max_age,
            cpus=cpus,
            memory_mib=memory_mib,
            pids=pids,
            disk_mib=disk_mib,
            snapshot_policy=snapshot_policy,
            name=name,
            labels=labels,
            metadata=metadata,
            auto_resume=auto_resume,
        )
        owner = _client(client, url, api_key, request_timeout)
        try:
            data = owner._transport.json("POST", "/v1/sessions", json=body, headers=idempotency_headers())
        except BaseException:
            if owner._implicit:
                owner.close()
            raise
        return cls(SessionInfo.from_json(data), owner, keep=keep)

    @classmethod
    def connect(
        cls,
        session_id: str,
        *,
        resume: bool = True,
        keep: bool = True,
        client: Optional[Client] = None,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        request_timeout: Optional[float] = None,
    ) -> "Session":
        """An existing session; one that is paused or suspended is resumed first (unless
        ``resume=False``). A connected session is kept when its ``with`` block ends (pass
        ``keep=False`` to destroy it there)."""
        owner = _client(client, url, api_key, request_timeout)
        session = cls(SessionInfo(id=session_id), owner, keep=keep)
        try:
            session.refresh()
            if session.state == SessionState.DESTROYED:
                raise NotFoundError(
                    f"session {session_id} was destroyed; create a new one", code="not_found", status=404
                )
            session._settle()
            if resume and session.state in (SessionState.PAUSED, SessionState.SUSPENDED):
                session.resume()
        except BaseException:
            session.close()
            raise
        return session

    def _settle(self) -> None:
        """Waits while the session is in a transitional state (resuming, suspending...)."""
        deadline = time.monotonic() + self._transport.config.request_timeout
        delay = 0.05
        while _transitional(self.info.state):
            if time.monotonic() > deadline:
                raise TimeoutError(f"session {self.id} stayed {self.info.state}")
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
            self.refresh()

    @classmethod
    def list(
        cls,
        *,
        labels: rq.Labels = None,
        state: Union[str, SessionState, None] = None,
        template: Optional[str] = None,
        all: bool = False,
        all_tenants: bool = False,
        client: Optional[Client] = None,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
    ) -> List[SessionInfo]:
        """Sessions, newest last: filtered by labels (``{"team": "x"}``, all must match),
        state and template; ``all`` includes destroyed ones, ``all_tenants`` (admin) every
        tenant's."""
        owner = _client(client, url, api_key, None)
        try:
            params = rq.list_params(labels=labels, state=state, template=template, all=all, all_tenants=all_tenants)
            data = owner._transport.json("GET", "/v1/sessions", params=params)
        finally:
            if owner._implicit:
                owner.close()
        sessions = [SessionInfo.from_json(s) for s in data["sessions"]]
        return rq.filter_sessions(sessions, labels=labels, state=state, template=template)

    # --- the session itself ------------------------------------------------------------------

    def _set(self, data: Dict[str, Any]) -> "Session":
        self.info = SessionInfo.from_json(data)
        return self

    def refresh(self) -> SessionInfo:
        """Reads the session from the server (``info`` and ``state`` are updated)."""
        return self._set(self._transport.json("GET", self._path)).info

    def update(
        self,
        *,
        idle_timeout: Union[Duration, int] = None,
        max_age: Union[Duration, int] = None,
        on_max_age: Optional[str] = None,
        auto_resume_max_age: Union[Duration, int] = None,
        snapshot_policy: Union[SnapshotPolicy, Mapping[str, Any], None] = None,
        name: Optional[str] = None,
        labels: Optional[Mapping[str, str]] = None,
        metadata: Optional[Mapping[str, str]] = None,
        auto_resume: Optional[bool] = None,
    ) -> SessionInfo:
        """Changes settings; ``idle_timeout=0`` or ``max_age=0`` turns that one off;
        ``on_max_age="suspend"`` suspends the session at its maximum age instead of destroying it;
        ``auto_resume_max_age`` is the maximum age an auto-resume sets, counted from it."""
        body = rq.update_body(
            idle_timeout=idle_timeout,
            max_age=max_age,
            on_max_age=on_max_age,
            auto_resume_max_age=auto_resume_max_age,
            snapshot_policy=snapshot_policy,
            name=name,
            labels=labels,
            metadata=metadata,
            auto_resume=auto_resume,
        )
        return self._set(self._transport.json("PATCH", self._path, json=body)).info

    def destroy(self) -> None:
        """Destroys the session and everything in it (its snapshots too), and lets go of its
        connection (:meth:`close`). Destroying it again does nothing."""
        if self.info.state == SessionState.DESTROYED and self._closed:
            return
        try:
            self._set(self._transport.json("DELETE", self._path, headers=idempotency_headers()))
        except NotFoundError:
            self.info.state = SessionState.DESTROYED  # already gone: what was asked for
        self.close()

    kill = destroy

    def pause(self) -> "Session":
        """Freezes every process in place (memory kept on the node); :meth:`resume` thaws."""
        return self._set(self._transport.json("POST", f"{self._path}/pause", headers=idempotency_headers()))

    def resume(self) -> "Session":
        """Thaws a paused session, or restores a suspended one."""
        return self._set(self._transport.json("POST", f"{self._path}/resume", headers=idempotency_headers()))

    def suspend(self) -> "Session":
        """Saves processes, memory and files to disk and frees the sandbox (needs CRIU)."""
        return self._set(self._transport.json("POST", f"{self._path}/suspend", headers=idempotency_headers()))

    def snapshot(
        self, kind: Union[str, SnapshotKind] = "disk", name: Optional[str] = None, *, outlives_session: bool = False
    ) -> Snapshot:
        """A snapshot: ``"disk"`` (files, O(1)) or ``"full"`` (files and processes, CRIU).

        ``outlives_session``: kept when the session is destroyed (new sessions can still be forked
        from it) until it is deleted."""
        body = rq.snapshot_body(kind, name, outlives_session)
        data = self._transport.json("POST", f"{self._path}/snapshots", json=body, headers=idempotency_headers())
        return Snapshot.from_json(data)

    def snapshots(self) -> List[Snapshot]:
        return [Snapshot.from_json(s) for s in self._transport.json("GET", f"{self._path}/snapshots")["snapshots"]]

    def get_snapshot(self, snapshot: rq.SnapshotRef) -> Snapshot:
        """One snapshot, with ``exclusive_bytes`` (what deleting it frees) measured."""
        return Snapshot.from_json(self._transport.json("GET", f"{self._path}/snapshots/{rq.snapshot_id(snapshot)}"))

    def delete_snapshot(self, snapshot: rq.SnapshotRef) -> None:
        self._transport.request(
            "DELETE", f"{self._path}/snapshots/{rq.snapshot_id(snapshot)}", headers=idempotency_headers()
        )

    def restore(self, snapshot: rq.SnapshotRef) -> "Session":
        """Takes the session back to ``snapshot`` (a new sandbox; the id stays)."""
        body = {"snapshot": rq.snapshot_id(snapshot)}
        return self._set(
            self._transport.json("POST", f"{self._path}/restore", json=body, headers=idempotency_headers())
        )

    def fork(
        self, count: int = 1, *, from_snapshot: Optional[rq.SnapshotRef] = None, keep: bool = False
    ) -> List["Session"]:
        """``count`` new sessions that continue from now (or from ``from_snapshot``). Each is
        a :class:`Session` of its own (use it as a context manager to destroy it)."""
        body = rq.fork_body(count, from_snapshot)
        data = self._transport.json("POST", f"{self._path}/fork", json=body, headers=idempotency_headers())
        return [Session(SessionInfo.from_json(s), self._client, keep=keep) for s in data["sessions"]]

    def create_token(
        self, scopes: Sequence[str], *, ttl_secs: Optional[int] = None, name: Optional[str] = None
    ) -> CreatedKey:
        """A token for a sub-agent: it may do ``scopes`` (``read``, ``exec``, ``fork``,
        ``snapshot``, ``destroy``) to this session and the sessions forked from it, nothing
        else, for ``ttl_secs`` (default an hour, at most 7 days). ``.key`` is the secret, shown
        once; give it to ``Space(api_key=...)``. Revoke it with ``DELETE /v1/keys/{id}``."""
        body: Dict[str, Any] = {"scopes": list(scopes)}
        if ttl_secs is not None:
            body["ttl_secs"] = ttl_secs
        if name is not None:
            body["name"] = name
        return CreatedKey.from_json(self._transport.json("POST", f"{self._path}/tokens", json=body))

    def stats(self) -> SessionStats:
        return SessionStats.from_json(self._transport.json("GET", f"{self._path}/stats"))

    def events(self) -> List[SessionEvent]:
        return [SessionEvent.from_json(e) for e in self._transport.json("GET", f"{self._path}/events")["events"]]

    # --- helpers -----------------------------------------------------------------------------

    def _user_ids(self, user: User) -> Optional[Tuple[int, Optional[int]]]:
        """``(uid, gid)`` for ``user``; a name is looked up in the sandbox once."""
        if user is None:
            return None
        ids = parse_user(user)
        if ids is not None:
            return ids
        name = str(user)
        if name not in self._uids:
            result = self.commands.run(["sh", "-c", 'id -u "$1" && id -g "$1"', "sh", name])
            lines = result.stdout.split()
            if result.exit_code != 0 or len(lines) != 2:
                raise BadRequestError(f"no user {name!r} in the sandbox: {result.stderr.strip()}", code="bad_request")
            self._uids[name] = (int(lines[0]), int(lines[1]))
        return self._uids[name]


__all__ = ["Client", "Session", "Ports", "Network"]
