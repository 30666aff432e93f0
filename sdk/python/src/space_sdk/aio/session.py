"""The asyncio client: :class:`AsyncClient` and :class:`AsyncSession`, the surface of the
sync ones with ``await`` (and ``async with``)."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import httpx

from .. import _requests as rq
from .._config import resolve
from .._transport import AsyncTransport, idempotency_headers
from .._wire import Duration, User, parse_user
from ..errors import BadRequestError, NotFoundError, TimeoutError
from ..models import (
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
from .admin import AsyncKeys, AsyncQuotas
from .commands import AsyncCommands
from .files import AsyncFiles
from .pty import AsyncPty


class AsyncClient:
    """A space server and the API key to use there; see :class:`space_sdk.Client`."""

    def __init__(
        self,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        *,
        request_timeout: Optional[float] = None,
        http_client: Optional[httpx.AsyncClient] = None,
    ) -> None:
        self.config = resolve(url, api_key, request_timeout)
        self._transport = AsyncTransport(self.config, http_client)
        self._users = 0
        self._implicit = False
        self.keys = AsyncKeys(self)
        """API keys (creating them needs the admin key)."""
        self.quotas = AsyncQuotas(self)
        """Tenant quotas (admin)."""

    @property
    def url(self) -> str:
        return self.config.url

    async def close(self) -> None:
        await self._transport.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def _retain(self) -> None:
        self._users += 1

    async def _release(self) -> None:
        self._users -= 1
        if self._users <= 0 and self._implicit:
            await self.close()

    async def health(self) -> bool:
        return (await self._transport.request("GET", "/v1/health")).status_code == 200

    async def status(self) -> Dict[str, Any]:
        return await self._transport.json("GET", "/v1/status")

    async def templates(self) -> List[Template]:
        return [Template.from_json(t) for t in (await self._transport.json("GET", "/v1/templates"))["templates"]]

    async def create_session(self, template: Optional[str] = None, **kwargs: Any) -> "AsyncSession":
        return await AsyncSession.create(template, client=self, **kwargs)

    async def connect_session(self, session_id: str, **kwargs: Any) -> "AsyncSession":
        return await AsyncSession.connect(session_id, client=self, **kwargs)

    async def list_sessions(self, **kwargs: Any) -> List[SessionInfo]:
        return await AsyncSession.list(client=self, **kwargs)


def _client(
    client: Optional[AsyncClient], url: Optional[str], api_key: Optional[str], request_timeout: Optional[float]
) -> AsyncClient:
    if client is not None:
        return client
    made = AsyncClient(url, api_key, request_timeout=request_timeout)
    made._implicit = True
    return made


def _transitional(state: Any) -> bool:
    return isinstance(state, SessionState) and state.is_transitional


class AsyncPorts:
    """``session.ports`` of an :class:`AsyncSession`; see :class:`space_sdk.Ports`."""

    def __init__(self, session: "AsyncSession") -> None:
        self._session = session
        self._preview: Dict[int, str] = {}

    def url(self, port: int, path: str = "") -> str:
        if int(port) in self._preview:
            return self._preview[int(port)].rstrip("/") + "/" + path.lstrip("/")
        return rq.port_url(self._session._client.url, self._session.id, port, path)

    @property
    def headers(self) -> Dict[str, str]:
        return {"Authorization": f"Bearer {self._session._client.config.api_key}"}

    async def expose(self, port: int, *, public: bool = False) -> PortAccess:
        data = await self._session._transport.json(
            "POST", f"{self._session._path}/ports/{int(port)}", json={"public": public}
        )
        access = PortAccess.from_json(data)
        if access.preview_url:
            self._preview[int(port)] = access.preview_url
        return access

    async def get(self, port: int) -> PortAccess:
        return PortAccess.from_json(
            await self._session._transport.json("GET", f"{self._session._path}/ports/{int(port)}")
        )

    async def list(self) -> List[PortAccess]:
        data = await self._session._transport.json("GET", f"{self._session._path}/ports")
        return [PortAccess.from_json(p) for p in data["ports"]]

    async def close(self, port: int) -> None:
        await self._session._transport.request("DELETE", f"{self._session._path}/ports/{int(port)}")
        self._preview.pop(int(port), None)


class AsyncNetwork:
    """``session.network`` of an :class:`AsyncSession`; see :class:`space_sdk.Network`."""

    def __init__(self, session: "AsyncSession") -> None:
        self._session = session

    async def get(self) -> SessionNetwork:
        return SessionNetwork.from_json(await self._session._transport.json("GET", f"{self._session._path}/network"))

    async def update(
        self,
        *,
        allow: Optional[Sequence[str]] = None,
        deny: Optional[Sequence[str]] = None,
        ports: Optional[Sequence[int]] = None,
        cidrs: Optional[Sequence[str]] = None,
        detached: Optional[bool] = None,
    ) -> SessionNetwork:
        body = rq.network_update(allow=allow, deny=deny, ports=ports, cidrs=cidrs, detached=detached)
        return SessionNetwork.from_json(
            await self._session._transport.json("PATCH", f"{self._session._path}/network", json=body)
        )

    async def grant(self, credential: str) -> SessionNetwork:
        data = await self._session._transport.json(
            "POST", f"{self._session._path}/grants", json={"credential": credential}
        )
        return SessionNetwork.from_json(data)

    async def revoke(self, credential: str) -> SessionNetwork:
        return SessionNetwork.from_json(
            await self._session._transport.json("DELETE", f"{self._session._path}/grants/{credential}")
        )

    async def audit(self, limit: Optional[int] = None) -> List[Dict[str, Any]]:
        params = {"limit": limit} if limit is not None else None
        return (await self._session._transport.json("GET", f"{self._session._path}/audit", params=params))["events"]


class AsyncSession:
    """A durable sandbox session (asyncio); see :class:`space_sdk.Session`.

    ``async with await AsyncSession.create(...) as session:`` destroys it at the end unless
    ``keep=True``."""

    def __init__(self, info: SessionInfo, client: AsyncClient, *, keep: bool = False) -> None:
        self.info = info
        self._client = client
        self._transport = client._transport
        self.keep = keep
        self._closed = False
        self._uids: Dict[str, Tuple[int, Optional[int]]] = {}
        client._retain()
        self.commands = AsyncCommands(self)
        self.files = AsyncFiles(self)
        self.pty = AsyncPty(self)
        self.ports = AsyncPorts(self)
        self.network = AsyncNetwork(self)

    @property
    def id(self) -> str:
        return self.info.id

    @property
    def state(self) -> SessionState:
        return self.info.state

    @property
    def _path(self) -> str:
        return f"/v1/sessions/{self.id}"

    def __repr__(self) -> str:
        return f"<AsyncSession {self.id} {self.info.state} template={self.info.template!r}>"

    async def __aenter__(self) -> "AsyncSession":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        try:
            if not self.keep:
                await self.destroy()
        finally:
            await self.close()

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self.commands._close()
            await self._client._release()

    @classmethod
    async def create(
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
        client: Optional[AsyncClient] = None,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        request_timeout: Optional[float] = None,
    ) -> "AsyncSession":
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
            data = await owner._transport.json("POST", "/v1/sessions", json=body, headers=idempotency_headers())
        except BaseException:
            if owner._implicit:
                await owner.close()
            raise
        return cls(SessionInfo.from_json(data), owner, keep=keep)

    @classmethod
    async def connect(
        cls,
        session_id: str,
        *,
        resume: bool = True,
        keep: bool = True,
        client: Optional[AsyncClient] = None,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        request_timeout: Optional[float] = None,
    ) -> "AsyncSession":
        owner = _client(client, url, api_key, request_timeout)
        session = cls(SessionInfo(id=session_id), owner, keep=keep)
        try:
            await session.refresh()
            if session.state == SessionState.DESTROYED:
                raise NotFoundError(
                    f"session {session_id} was destroyed; create a new one", code="not_found", status=404
                )
            await session._settle()
            if resume and session.state in (SessionState.PAUSED, SessionState.SUSPENDED):
                await session.resume()
        except BaseException:
            await session.close()
            raise
        return session

    async def _settle(self) -> None:
        deadline = time.monotonic() + self._transport.config.request_timeout
        delay = 0.05
        while _transitional(self.info.state):
            if time.monotonic() > deadline:
                raise TimeoutError(f"session {self.id} stayed {self.info.state}")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
            await self.refresh()

    @classmethod
    async def list(
        cls,
        *,
        labels: rq.Labels = None,
        state: Union[str, SessionState, None] = None,
        template: Optional[str] = None,
        all: bool = False,
        all_tenants: bool = False,
        client: Optional[AsyncClient] = None,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
    ) -> List[SessionInfo]:
        owner = _client(client, url, api_key, None)
        try:
            params = rq.list_params(labels=labels, state=state, template=template, all=all, all_tenants=all_tenants)
            data = await owner._transport.json("GET", "/v1/sessions", params=params)
        finally:
            if owner._implicit:
                await owner.close()
        sessions = [SessionInfo.from_json(s) for s in data["sessions"]]
        return rq.filter_sessions(sessions, labels=labels, state=state, template=template)

    def _set(self, data: Dict[str, Any]) -> "AsyncSession":
        self.info = SessionInfo.from_json(data)
        return self

    async def refresh(self) -> SessionInfo:
        return self._set(await self._transport.json("GET", self._path)).info

    async def update(
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
        return self._set(await self._transport.json("PATCH", self._path, json=body)).info

    async def destroy(self) -> None:
        if self.info.state == SessionState.DESTROYED and self._closed:
            return
        try:
            self._set(await self._transport.json("DELETE", self._path, headers=idempotency_headers()))
        except NotFoundError:
            self.info.state = SessionState.DESTROYED  # already gone: what was asked for
        await self.close()

    kill = destroy

    async def _lifecycle(self, action: str) -> "AsyncSession":
        return self._set(await self._transport.json("POST", f"{self._path}/{action}", headers=idempotency_headers()))

    async def pause(self) -> "AsyncSession":
        return await self._lifecycle("pause")

    async def resume(self) -> "AsyncSession":
        return await self._lifecycle("resume")

    async def suspend(self) -> "AsyncSession":
        return await self._lifecycle("suspend")

    async def snapshot(
        self, kind: Union[str, SnapshotKind] = "disk", name: Optional[str] = None, *, outlives_session: bool = False
    ) -> Snapshot:
        body = rq.snapshot_body(kind, name, outlives_session)
        return Snapshot.from_json(
            await self._transport.json("POST", f"{self._path}/snapshots", json=body, headers=idempotency_headers())
        )

    async def snapshots(self) -> List[Snapshot]:
        return [
            Snapshot.from_json(s) for s in (await self._transport.json("GET", f"{self._path}/snapshots"))["snapshots"]
        ]

    async def get_snapshot(self, snapshot: rq.SnapshotRef) -> Snapshot:
        return Snapshot.from_json(
            await self._transport.json("GET", f"{self._path}/snapshots/{rq.snapshot_id(snapshot)}")
        )

    async def delete_snapshot(self, snapshot: rq.SnapshotRef) -> None:
        await self._transport.request(
            "DELETE", f"{self._path}/snapshots/{rq.snapshot_id(snapshot)}", headers=idempotency_headers()
        )

    async def restore(self, snapshot: rq.SnapshotRef) -> "AsyncSession":
        body = {"snapshot": rq.snapshot_id(snapshot)}
        return self._set(
            await self._transport.json("POST", f"{self._path}/restore", json=body, headers=idempotency_headers())
        )

    async def fork(
        self, count: int = 1, *, from_snapshot: Optional[rq.SnapshotRef] = None, keep: bool = False
    ) -> List["AsyncSession"]:
        body = rq.fork_body(count, from_snapshot)
        data = await self._transport.json("POST", f"{self._path}/fork", json=body, headers=idempotency_headers())
        return [AsyncSession(SessionInfo.from_json(s), self._client, keep=keep) for s in data["sessions"]]

    async def create_token(
        self, scopes: Sequence[str], *, ttl_secs: Optional[int] = None, name: Optional[str] = None
    ) -> CreatedKey:
        """As :meth:`space_sdk.Session.create_token`."""
        body: Dict[str, Any] = {"scopes": list(scopes)}
        if ttl_secs is not None:
            body["ttl_secs"] = ttl_secs
        if name is not None:
            body["name"] = name
        return CreatedKey.from_json(await self._transport.json("POST", f"{self._path}/tokens", json=body))

    async def stats(self) -> SessionStats:
        return SessionStats.from_json(await self._transport.json("GET", f"{self._path}/stats"))

    async def events(self) -> List[SessionEvent]:
        return [
            SessionEvent.from_json(e) for e in (await self._transport.json("GET", f"{self._path}/events"))["events"]
        ]

    async def _user_ids(self, user: User) -> Optional[Tuple[int, Optional[int]]]:
        if user is None:
            return None
        ids = parse_user(user)
        if ids is not None:
            return ids
        name = str(user)
        if name not in self._uids:
            result = await self.commands.run(["sh", "-c", 'id -u "$1" && id -g "$1"', "sh", name])
            lines = result.stdout.split()
            if result.exit_code != 0 or len(lines) != 2:
                raise BadRequestError(f"no user {name!r} in the sandbox: {result.stderr.strip()}", code="bad_request")
            self._uids[name] = (int(lines[0]), int(lines[1]))
        return self._uids[name]


__all__ = ["AsyncClient", "AsyncSession", "AsyncPorts", "AsyncNetwork"]
