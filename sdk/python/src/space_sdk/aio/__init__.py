"""The asyncio client of space: ``AsyncSession`` and friends (also importable from
``space_sdk``)."""

from .admin import AsyncKeys, AsyncQuotas
from .commands import AsyncCommandHandle, AsyncCommands
from .files import AsyncFiles, AsyncFileStream, AsyncWatcher
from .pty import AsyncPty, AsyncPtyHandle
from .session import AsyncClient, AsyncNetwork, AsyncPorts, AsyncSession

__all__ = [
    "AsyncClient",
    "AsyncSession",
    "AsyncCommands",
    "AsyncCommandHandle",
    "AsyncFiles",
    "AsyncFileStream",
    "AsyncWatcher",
    "AsyncPty",
    "AsyncPtyHandle",
    "AsyncPorts",
    "AsyncNetwork",
    "AsyncKeys",
    "AsyncQuotas",
]
