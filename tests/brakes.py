"""One face for every brake, so that each behaviour test is written once.

`Checker` wraps a `LoopBrake`, a `DistributedBrake` or an
`AsyncDistributedBrake` behind coroutine methods; tests `await` them whatever
the brake underneath.
"""

from __future__ import annotations

import inspect
from typing import Any

from distbrake import LoopBrakeError, SessionState, Verdict


class Checker:
    def __init__(self, brake: Any) -> None:
        self.brake = brake

    async def _maybe(self, value: Any) -> Any:
        return await value if inspect.isawaitable(value) else value

    async def check(self, tool: str, args: Any, **kw: Any) -> Verdict:
        return await self._maybe(self.brake.check(tool, args, **kw))  # type: ignore[no-any-return]

    async def count(self, tool: str, args: Any, **kw: Any) -> int:
        """The count this call got, allowed or denied (-count when denied)."""
        try:
            return (await self.check(tool, args, **kw)).count
        except LoopBrakeError as error:
            return -error.count

    async def inspect(self, session_id: str) -> SessionState | None:
        return await self._maybe(self.brake.inspect(session_id))  # type: ignore[no-any-return]

    async def clear(self, session_id: str) -> bool:
        return bool(await self._maybe(self.brake.clear(session_id)))

    async def sessions(self, match: str | None = None) -> list[SessionState]:
        found = self.brake.sessions(match)
        if hasattr(found, "__aiter__"):
            return [state async for state in found]
        return list(found)

    async def close(self) -> None:
        closer = getattr(self.brake, "aclose", None) or getattr(self.brake, "close", None)
        if closer is not None:
            await self._maybe(closer())


async def close_brakes(brakes: list[Any]) -> None:
    """Close every brake a test made (sync `close()`, async `aclose()`, none for LoopBrake)."""
    for brake in brakes:
        await Checker(brake).close()
