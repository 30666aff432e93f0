"""API keys and tenant quotas (sync): ``client.keys`` and ``client.quotas``.

Creating keys, listing every tenant's and setting quotas need the admin key; a tenant's key
lists and revokes its own tenant's keys."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional

from ._wire import Duration, seconds
from .models import ApiKey, CreatedKey, TenantQuota

if TYPE_CHECKING:  # pragma: no cover
    from .session import Client


def key_body(tenant: str, name: Optional[str], expires_in: Duration) -> Dict[str, Any]:
    body: Dict[str, Any] = {"tenant": tenant}
    if name is not None:
        body["name"] = name
    if expires_in is not None:
        body["expires_in_secs"] = seconds(expires_in, "expires_in")
    return body


def quota_body(**limits: Any) -> Dict[str, Any]:
    """A PUT replaces all four limits: ``None`` (or leaving one out) means unlimited."""
    return {k: v for k, v in limits.items() if v is not None}


class Keys:
    def __init__(self, client: "Client") -> None:
        self._client = client

    def create(self, tenant: str, *, name: Optional[str] = None, expires_in: Duration = None) -> CreatedKey:
        """A new key of ``tenant`` (created if new); ``expires_in`` seconds or ``timedelta``."""
        return CreatedKey.from_json(
            self._client._transport.json("POST", "/v1/keys", json=key_body(tenant, name, expires_in))
        )

    def list(self) -> List[ApiKey]:
        return [ApiKey.from_json(k) for k in self._client._transport.json("GET", "/v1/keys")["keys"]]

    def revoke(self, key_id: str) -> None:
        """Revokes the key: its next request fails with 401 ``key_revoked``."""
        self._client._transport.request("DELETE", f"/v1/keys/{key_id}")

    def rotate(self, key_id: str) -> CreatedKey:
        """A new key with the same tenant and name; the old one is revoked."""
        return CreatedKey.from_json(self._client._transport.json("POST", f"/v1/keys/{key_id}/rotate"))


class Quotas:
    def __init__(self, client: "Client") -> None:
        self._client = client

    def get(self, tenant: str) -> TenantQuota:
        return TenantQuota.from_json(self._client._transport.json("GET", f"/v1/tenants/{tenant}/quota"))

    def set(
        self,
        tenant: str,
        *,
        max_sessions: Optional[int] = None,
        max_cpus: Optional[float] = None,
        max_memory_mib: Optional[int] = None,
        max_disk_mib: Optional[int] = None,
    ) -> TenantQuota:
        """Sets all four limits (``None``: unlimited). A create or fork beyond one of them
        raises ``QuotaExceededError`` (429)."""
        body = quota_body(
            max_sessions=max_sessions, max_cpus=max_cpus, max_memory_mib=max_memory_mib, max_disk_mib=max_disk_mib
        )
        return TenantQuota.from_json(self._client._transport.json("PUT", f"/v1/tenants/{tenant}/quota", json=body))


__all__ = ["Keys", "Quotas"]
