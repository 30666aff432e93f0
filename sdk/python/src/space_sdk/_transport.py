"""HTTP and WebSocket plumbing shared by the sync and async clients: one pooled connection
per client (reused across calls), the API's error envelope turned into typed exceptions,
and retries that cannot run a request twice."""

from __future__ import annotations

import asyncio
import time
import uuid
from contextlib import asynccontextmanager, contextmanager
from typing import Any, AsyncIterator, Dict, Iterator, Mapping, Optional

import httpx

from ._config import Config
from .errors import APIConnectionError, SpaceError, TimeoutError, error_from_body

Params = Any
"""Query parameters: a mapping, or (name, value) pairs for repeated names."""

# Transport failures after which a request may be sent again: a connection that could not be
# made never carried it, and a request under an Idempotency-Key is replayed, not run twice.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
_MAYBE_SENT = (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError)
RETRIES = 2


def idempotency_headers(headers: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """Headers that make a mutating call safe to retry (``docs/control-plane.md``)."""
    out = dict(headers or {})
    out.setdefault("Idempotency-Key", f"sdk-{uuid.uuid4()}")
    return out


def translate(error: httpx.HTTPError, what: str) -> SpaceError:
    if isinstance(error, httpx.TimeoutException):
        return TimeoutError(f"{what}: no answer in time ({type(error).__name__}); pass a longer request_timeout")
    return APIConnectionError(f"{what}: {error or type(error).__name__}")


def _may_retry(error: Exception, headers: Mapping[str, str], method: str) -> bool:
    if isinstance(error, _NOT_SENT):
        return True
    safe = method == "GET" or "Idempotency-Key" in headers
    return safe and isinstance(error, _MAYBE_SENT)


def check(response: httpx.Response) -> httpx.Response:
    if response.status_code >= 400:
        raise error_from_body(response.status_code, response.content, response.reason_phrase)
    return response


def _timeout(config: Config, seconds: Optional[float]) -> httpx.Timeout:
    return httpx.Timeout(seconds or config.request_timeout, connect=min(30.0, config.request_timeout))


def limits() -> httpx.Limits:
    return httpx.Limits(max_connections=64, max_keepalive_connections=16, keepalive_expiry=20.0)


class SyncTransport:
    """The sync client's HTTP connection pool."""

    def __init__(self, config: Config, http: Optional[httpx.Client] = None) -> None:
        self.config = config
        self._owned = http is None
        self.http = http or httpx.Client(
            base_url=config.url, headers=config.headers, timeout=_timeout(config, None), limits=limits()
        )
        if not self._owned:
            self.http.headers.update(config.headers)

    def close(self) -> None:
        if self._owned:
            self.http.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Params = None,
        content: Any = None,
        headers: Optional[Dict[str, str]] = None,
        timeout: Optional[float] = None,
        retry: bool = True,
    ) -> httpx.Response:
        headers = headers or {}
        for attempt in range(RETRIES + 1):
            try:
                response = self.http.request(
                    method,
                    path,
                    json=json,
                    params=params,
                    content=content,
                    headers=headers,
                    timeout=_timeout(self.config, timeout),
                )
                return check(response)
            except httpx.HTTPError as e:
                if not (retry and attempt < RETRIES and _may_retry(e, headers, method)):
                    raise translate(e, f"{method} {path}") from e
                time.sleep(0.2 * (attempt + 1))
        raise AssertionError("unreachable")

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.request(method, path, **kwargs)
        return response.json() if response.content else None

    @contextmanager
    def stream(
        self, method: str, path: str, *, params: Params = None, timeout: Optional[float] = None
    ) -> Iterator[httpx.Response]:
        try:
            with self.http.stream(method, path, params=params, timeout=_timeout(self.config, timeout)) as response:
                if response.status_code >= 400:
                    response.read()
                    check(response)
                yield response
        except httpx.HTTPError as e:
            raise translate(e, f"{method} {path}") from e


class AsyncTransport:
    """The async client's HTTP connection pool."""

    def __init__(self, config: Config, http: Optional[httpx.AsyncClient] = None) -> None:
        self.config = config
        self._owned = http is None
        self.http = http or httpx.AsyncClient(
            base_url=config.url, headers=config.headers, timeout=_timeout(config, None), limits=limits()
        )
        if not self._owned:
            self.http.headers.update(config.headers)

    async def close(self) -> None:
        if self._owned:
            await self.http.aclose()

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Params = None,
        content: Any = None,
        headers: Optional[Dict[str, str]] = None,
        timeout: Optional[float] = None,
        retry: bool = True,
    ) -> httpx.Response:
        headers = headers or {}
        for attempt in range(RETRIES + 1):
            try:
                response = await self.http.request(
                    method,
                    path,
                    json=json,
                    params=params,
                    content=content,
                    headers=headers,
                    timeout=_timeout(self.config, timeout),
                )
                return check(response)
            except httpx.HTTPError as e:
                if not (retry and attempt < RETRIES and _may_retry(e, headers, method)):
                    raise translate(e, f"{method} {path}") from e
                await asyncio.sleep(0.2 * (attempt + 1))
        raise AssertionError("unreachable")

    async def json(self, method: str, path: str, **kwargs: Any) -> Any:
        response = await self.request(method, path, **kwargs)
        return response.json() if response.content else None

    @asynccontextmanager
    async def stream(
        self, method: str, path: str, *, params: Params = None, timeout: Optional[float] = None
    ) -> AsyncIterator[httpx.Response]:
        try:
            async with self.http.stream(
                method, path, params=params, timeout=_timeout(self.config, timeout)
            ) as response:
                if response.status_code >= 400:
                    await response.aread()
                    check(response)
                yield response
        except httpx.HTTPError as e:
            raise translate(e, f"{method} {path}") from e
