"""API keys and tenant quotas (asyncio); see :mod:`space_sdk.admin`."""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional

from .._wire import Duration
from ..admin import key_body, quota_body
from ..models import ApiKey, CreatedKey, TenantQuota

if TYPE_CHECKING:  # pragma: no cover
    from .session import AsyncClient


class AsyncKeys:
    def __init__(self, client: "AsyncClient") -> None:
        self._client = client

    async def create(self, tenant: str, *, name: Optional[str] = None, expires_in: Duration = None) -> CreatedKey:
        data = await self._client._transport.json("POST", "/v1/keys", json=key_body(tenant, name, expires_in))
        return CreatedKey.from_json(data)

    async def list(self) -> List[ApiKey]:
        return [ApiKey.from_json(k) for k in (await self._client._transport.json("GET", "/v1/keys"))["keys"]]

    async def revoke(self, key_id: str) -> None:
        await self._client._transport.request("DELETE", f"/v1/keys/{key_id}")

    async def rotate(self, key_id: str) -> CreatedKey:
        return CreatedKey.from_json(await self._client._transport.json("POST", f"/v1/keys/{key_id}/rotate"))


class AsyncQuotas:
    def __init__(self, client: "AsyncClient") -> None:
        self._client = client

    async def get(self, tenant: str) -> TenantQuota:
        return TenantQuota.from_json(await self._client._transport.json("GET", f"/v1/tenants/{tenant}/quota"))

    async def set(
        self,
        tenant: str,
        *,
        max_sessions: Optional[int] = None,
        max_cpus: Optional[float] = None,
        max_memory_mib: Optional[int] = None,
        max_disk_mib: Optional[int] = None,
    ) -> TenantQuota:
        body = quota_body(
            max_sessions=max_sessions, max_cpus=max_cpus, max_memory_mib=max_memory_mib, max_disk_mib=max_disk_mib
        )
        return TenantQuota.from_json(
            await self._client._transport.json("PUT", f"/v1/tenants/{tenant}/quota", json=body)
        )


__all__ = ["AsyncKeys", "AsyncQuotas"]
