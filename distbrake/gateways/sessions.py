"""Which session a call seen by a gateway belongs to: one rule, first match wins.

A gateway (`distbrake proxy`, the Docker interceptor, LiteLLM's guardrail) sees
calls from clients it did not build. MCP 2026-07-28 removed `Mcp-Session-Id`,
so the session comes from what each client sends, read in this order:

1. `--session-from PATH`: the dotted `_meta` path the operator named
   (`--session-from agent.thread` reads `_meta["agent"]["thread"]`);
2. `_meta.session_id` (and `_meta.run_id`), the keys the brake's MCP adapters read;
3. Codex: `_meta["x-codex-turn-metadata"]` `session_id` (its `turn_id` is the run),
   an object or its JSON text;
4. VS Code: `_meta.vscode.conversationId`;
5. OpenCode: `_meta.sessionID`;
6. W3C baggage in `_meta` (`_meta.baggage`, `"session.id=...,..."`): `session.id`;
7. the authenticated principal (`"principal:<client_id>:<issuer>:<subject>"`);
8. a handshake-era transport session (`"mcp-session:<id>"`: stateful Streamable
   HTTP or one stdio connection, protocol 2025-11-25 or older);
9. else one session shared by every such call, `"default"`, said once with a
   WARNING; with `require_session` the call is refused instead.

Ids of steps 1-6 are scoped by the principal when the request is
authenticated (`"<principal>/<id>"`), so a client never reaches another
principal's streaks; under `scope="run"` a run id (`run_id`, Codex's
`turn_id`) makes each run its own streak (`"<session>/run/<run>"`). An id is a
non-empty str (or an int) of at most 256 characters; anything else is not a
session id and the next step is tried. Ids are never logged.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import MissingSessionError
from ..integrations.kernel import SCOPES, Scope

__all__ = ["MAX_ID_LENGTH", "SHARED_SESSION", "GatewaySessions", "client_session", "meta_path"]

logger = logging.getLogger("distbrake")

MAX_ID_LENGTH = 256
SHARED_SESSION = "default"
_MAX_BAGGAGE = 8192


def _id(value: object) -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        value = str(value)
    if isinstance(value, str) and 0 < len(value) <= MAX_ID_LENGTH:
        return value
    return None


def meta_path(meta: Mapping[str, Any] | None, path: str) -> object:
    """The value at a dotted `path` of `meta` (None when any step is missing or not an object)."""
    node: object = meta
    for part in path.split("."):
        if not isinstance(node, Mapping):
            return None
        node = node.get(part)
    return node


def _codex(meta: Mapping[str, Any]) -> tuple[str | None, str | None]:
    raw = meta.get("x-codex-turn-metadata")
    if isinstance(raw, str) and len(raw) <= _MAX_BAGGAGE:
        try:
            raw = json.loads(raw)
        except ValueError:
            return None, None
    if not isinstance(raw, Mapping):
        return None, None
    return _id(raw.get("session_id")), _id(raw.get("turn_id"))


def _baggage(meta: Mapping[str, Any]) -> str | None:
    raw = meta.get("baggage")
    if not isinstance(raw, str) or len(raw) > _MAX_BAGGAGE:
        return None
    for member in raw.split(","):
        key, sep, value = member.partition("=")
        if sep and key.strip() == "session.id":
            from urllib.parse import unquote

            return _id(unquote(value.split(";", 1)[0].strip()))
    return None


def client_session(
    meta: Mapping[str, Any] | None,
    *,
    session_from: str | None = None,
    meta_key: str | None = "session_id",
    run_key: str | None = "run_id",
) -> tuple[str | None, str | None, str] | None:
    """Steps 1-6 of the module text: `(session, run, source)`, or None when the client names none.

    `source` says which step matched (`"session-from"`, `"meta"`, `"codex"`,
    `"vscode"`, `"opencode"`, `"baggage"`).
    """
    if not isinstance(meta, Mapping):
        return None
    run = _id(meta.get(run_key)) if run_key else None
    if session_from:
        found = _id(meta_path(meta, session_from))
        if found is not None:
            return found, run, "session-from"
    explicit = _id(meta.get(meta_key)) if meta_key else None
    if explicit is not None or run is not None:
        return explicit, run, "meta"
    session, turn = _codex(meta)
    if session is not None:
        return session, turn, "codex"
    vscode = meta.get("vscode")
    found = _id(vscode.get("conversationId")) if isinstance(vscode, Mapping) else None
    if found is not None:
        return found, None, "vscode"
    found = _id(meta.get("sessionID"))
    if found is not None:
        return found, None, "opencode"
    found = _baggage(meta)
    if found is not None:
        return found, None, "baggage"
    return None


class GatewaySessions:
    """The session rule of the module text, with its options; one per gateway (it warns once).

    `resolve(meta, principal, transport)` returns the session id, or raises
    `MissingSessionError` under `require_session` when steps 1-8 found none.
    """

    def __init__(
        self,
        *,
        session_from: str | None = None,
        require_session: bool = False,
        scope: Scope = "run",
        meta_key: str | None = "session_id",
        run_key: str | None = "run_id",
    ) -> None:
        if scope not in SCOPES:
            from ..errors import ConfigurationError

            raise ConfigurationError(f"scope must be one of {', '.join(map(repr, SCOPES))}, not {scope!r}")
        if session_from is not None and (not session_from or "" in session_from.split(".")):
            from ..errors import ConfigurationError

            raise ConfigurationError("session_from must be a dotted _meta path such as agent.thread")
        self.session_from = session_from
        self.require_session = require_session
        self.scope: Scope = scope
        self.meta_key = meta_key
        self.run_key = run_key
        self._warned = False

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in ("session_from", "require_session", "scope"))
        return f"{type(self).__name__}({shown})"

    def resolve(
        self,
        meta: Mapping[str, Any] | None,
        principal: str | None = None,
        transport: Callable[[], str | None] | None = None,
    ) -> str:
        """The session of one call (steps 1-9 of the module text)."""
        named = client_session(
            meta, session_from=self.session_from, meta_key=self.meta_key, run_key=self.run_key
        )
        if named is not None:
            session, run, _ = named
            if principal is not None:
                session = principal if session is None else f"{principal}/{session}"
            if self.scope == "run" and run is not None:
                return f"run/{run}" if session is None else f"{session}/run/{run}"
            if session is not None:
                return session
        if principal is not None:
            return principal
        found = transport() if transport is not None else None
        if found is not None:
            return found
        return self.shared()

    def shared(self) -> str:
        """Step 9: the shared session (a WARNING the first time), or MissingSessionError."""
        if self.require_session:
            raise MissingSessionError(
                "loop brake: this gateway requires a session and the call names none; send _meta "
                '{"session_id": "..."} (or the session your client sends, see the README "Gateways")'
            )
        if not self._warned:
            self._warned = True
            logger.warning(
                'distbrake gateway: a call names no session, so it counts in the one session "default" '
                "shared by every such call (different agents can deny each other); have the client send "
                "_meta.session_id, pass --session-from PATH, or --require-session to refuse such calls"
            )
        return SHARED_SESSION
