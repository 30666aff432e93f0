"""Fixtures of the SDK's tests, which run against a live server.

``SPACE_URL`` and ``SPACE_API_KEY`` name it; without them every live test fails (it is never
skipped). With an admin key the run uses a tenant of its own, so sweeping up what a failed
test left behind never touches anybody else's sessions."""

from __future__ import annotations

import os
import uuid
from typing import Any, Callable, Iterator, List, Union

import httpx
import pytest

from space_sdk import AsyncClient, AsyncSession, Client, NotFoundError, PermissionDeniedError, Session

TEMPLATE = "busybox"


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def server() -> dict:
    """The server under test and the key of this run's tenant."""
    url, key = os.environ.get("SPACE_URL"), os.environ.get("SPACE_API_KEY")
    if not url or not key:
        pytest.fail(
            "the SDK tests run against a live server: set SPACE_URL and SPACE_API_KEY "
            "(scripts/test-sdks.sh starts one and sets them)",
            pytrace=False,
        )
    tenant = f"sdk-test-{uuid.uuid4().hex[:8]}"
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as http:
        response = http.post("/v1/keys", json={"tenant": tenant})
    if response.status_code == 403:
        return {"url": url, "key": key, "admin_key": None, "tenant": None}
    assert response.status_code == 201, response.text
    return {"url": url, "key": response.json()["key"], "admin_key": key, "tenant": tenant}


@pytest.fixture(scope="session")
def client(server: dict) -> Iterator[Client]:
    client = Client(server["url"], server["key"])
    yield client
    # What a failed test may have left (each test also cleans up after itself).
    if server["tenant"] is not None:
        for info in Session.list(client=client):
            Session.connect(info.id, resume=False, client=client).destroy()
    client.close()


@pytest.fixture
def track(client: Client) -> Iterator[Callable[[Any], Any]]:
    """Registers sessions (or lists of them) to be destroyed when the test ends, even if it fails."""
    tracked: List[Union[Session, str]] = []

    def add(item: Any) -> Any:
        tracked.extend(item if isinstance(item, list) else [item])
        return item

    yield add
    for item in tracked:
        session_id = item if isinstance(item, str) else item.id
        try:
            Session.connect(session_id, resume=False, client=client).destroy()
        except NotFoundError:
            pass


@pytest.fixture
def new_session(client: Client, track: Callable[[Any], Any]) -> Callable[..., Session]:
    """Creates a busybox session (keyword arguments go to ``Session.create``), destroyed after the test."""

    def make(**kwargs: Any) -> Session:
        kwargs.setdefault("template", TEMPLATE)
        return track(Session.create(client=client, **kwargs))

    return make


@pytest.fixture
def session(new_session: Callable[..., Session]) -> Session:
    return new_session()


@pytest.fixture
async def aclient(server: dict) -> Any:
    client = AsyncClient(server["url"], server["key"])
    yield client
    await client.close()


@pytest.fixture
async def asession(aclient: AsyncClient, track: Callable[[Any], Any]) -> Any:
    session = await AsyncSession.create(template=TEMPLATE, client=aclient)
    track(session.id)
    yield session


@pytest.fixture
def admin(server: dict) -> Client:
    """A client with the admin key (the tests of admin-only calls need one)."""
    if server["admin_key"] is None:
        pytest.fail("this test needs SPACE_API_KEY to be the server's admin key", pytrace=False)
    return Client(server["url"], server["admin_key"])


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


__all__ = ["TEMPLATE", "unique", "PermissionDeniedError"]
