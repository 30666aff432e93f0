"""Python SDK of space: secure, stateful sandboxes for AI agents.

    from space_sdk import Session

    with Session.create(template="busybox") as session:
        session.files.write("/work/hello.sh", "echo hello")
        print(session.commands.run("sh /work/hello.sh").stdout)

``Session`` is the sync client, ``AsyncSession`` the asyncio one; both read ``SPACE_URL`` and
``SPACE_API_KEY`` unless given ``url=``/``api_key=``. Errors are :class:`SpaceError`
subclasses carrying the API's ``code``, HTTP ``status`` and ``message``.
"""

__version__ = "0.1.0"

from .admin import Keys, Quotas  # noqa: E402
from .aio import (  # noqa: E402
    AsyncClient,
    AsyncCommandHandle,
    AsyncCommands,
    AsyncFiles,
    AsyncFileStream,
    AsyncKeys,
    AsyncNetwork,
    AsyncPorts,
    AsyncPty,
    AsyncPtyHandle,
    AsyncQuotas,
    AsyncSession,
    AsyncWatcher,
)
from .commands import CommandHandle, Commands  # noqa: E402
from .errors import *  # noqa: E402,F401,F403
from .errors import __all__ as _error_names  # noqa: E402
from .files import Files, FileStream, Watcher  # noqa: E402
from .models import *  # noqa: E402,F401,F403
from .models import __all__ as _model_names  # noqa: E402
from .pty import Pty, PtyHandle, PtySize  # noqa: E402
from .session import Client, Network, Ports, Session  # noqa: E402

__all__ = [
    "__version__",
    "Client",
    "Session",
    "Commands",
    "CommandHandle",
    "Files",
    "FileStream",
    "Watcher",
    "Pty",
    "PtyHandle",
    "PtySize",
    "Ports",
    "Network",
    "Keys",
    "Quotas",
    "AsyncKeys",
    "AsyncQuotas",
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
    *_error_names,
    *_model_names,
]
