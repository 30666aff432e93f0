"""Where the server is and which key to use: arguments first, then the environment."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from .errors import ConfigurationError

DEFAULT_URL = "http://127.0.0.1:7070"
"""What ``space serve`` listens on by default (as the CLI assumes)."""

DEFAULT_REQUEST_TIMEOUT = 660.0
"""Seconds a call may take: the server itself waits up to 600 s for a create, restore or fork."""


@dataclass(frozen=True)
class Config:
    url: str
    api_key: str
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT

    @property
    def ws_url(self) -> str:
        if self.url.startswith("https://"):
            return "wss://" + self.url[len("https://") :]
        return "ws://" + self.url[len("http://") :]

    @property
    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}", "User-Agent": f"space-sdk-python/{_version()}"}


def resolve(url: Optional[str], api_key: Optional[str], request_timeout: Optional[float]) -> Config:
    url = (url or os.environ.get("SPACE_URL") or DEFAULT_URL).rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ConfigurationError(f"the server URL must start with http:// or https://, got {url!r}")
    key = api_key or os.environ.get("SPACE_API_KEY")
    if not key:
        raise ConfigurationError(
            "no API key: pass api_key=... or set SPACE_API_KEY (the server's admin key is in "
            "DATA_DIR/admin.key; `space key create --tenant NAME` makes one for a tenant)"
        )
    return Config(url=url, api_key=key.strip(), request_timeout=request_timeout or DEFAULT_REQUEST_TIMEOUT)


def _version() -> str:
    from . import __version__

    return __version__
