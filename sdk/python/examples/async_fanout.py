"""Fan out with the asyncio client: prepare one session, fork it, and try a different
approach in each fork at once; keep the best and throw the rest away.

    SPACE_URL=http://127.0.0.1:7070 SPACE_API_KEY=... python examples/async_fanout.py
"""

from __future__ import annotations

import asyncio

from space_sdk import AsyncSession

APPROACHES = ["sort -n", "sort -rn", "sort -n | uniq"]


async def main() -> None:
    async with await AsyncSession.create(template="busybox") as base:
        await base.files.write("/work/numbers", "\n".join(str(n) for n in [5, 3, 9, 3, 1]) + "\n")
        forks = await base.fork(len(APPROACHES))
        try:
            results = await asyncio.gather(
                *(fork.commands.run(f"{approach} /work/numbers | head -1") for fork, approach in zip(forks, APPROACHES))
            )
            for approach, result in zip(APPROACHES, results):
                print(f"{approach:16} -> {result.stdout.strip()}")
        finally:
            await asyncio.gather(*(fork.destroy() for fork in forks))
            await asyncio.gather(*(fork.close() for fork in forks))


if __name__ == "__main__":
    asyncio.run(main())
