"""The Redis step without I/O: key derivation, the script, ARGV in, reply out.

Everything the sync and async distributed brakes share about talking to
Redis lives here, so the two only send and receive.
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Mapping, Sequence
from functools import lru_cache
from importlib import resources
from pathlib import Path

from .base import PreparedCall, SessionState
from .errors import ScriptReplyError

__all__ = [
    "FIELDS",
    "SESSION_CHARS",
    "TOOL_CHARS",
    "decode_reply",
    "decode_state",
    "encode_call",
    "key_pattern",
    "script_source",
    "session_key",
]

SCRIPT_FILE = "brake.lua"
SESSION_CHARS = 128  # longest session id kept for inspection (the key is always a hash)
TOOL_CHARS = 64  # longest tool name kept for inspection
FIELDS = (b"s", b"t", b"h", b"n", b"u")  # session, tool, id, count, updated (see lua/brake.lua)


@lru_cache(maxsize=1)
def script_source() -> str:
    """The text of `lua/brake.lua`: from the installed wheel, else the source tree."""
    packaged = resources.files("distbrake").joinpath("lua", SCRIPT_FILE)
    if packaged.is_file():
        return packaged.read_text(encoding="utf-8")
    tree = Path(__file__).resolve().parent.parent / "lua" / SCRIPT_FILE
    return tree.read_text(encoding="utf-8")


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


@lru_cache(maxsize=4096)
def session_key(session_id: str, key_prefix: str = "distbrake") -> str:
    """The Redis key of a session's slot: `<prefix>:<22 chars of base64url(sha256(id))>`.

    Bounded in length and distinct for any session id (empty, huge, with
    braces, globs, newlines, any Unicode); it holds no hash tag, so sessions
    spread over every Cluster slot.
    """
    digest = hashlib.sha256(_utf8(session_id)).digest()
    return f"{key_prefix}:{base64.urlsafe_b64encode(digest[:16]).decode('ascii')[:22]}"


def key_pattern(key_prefix: str) -> str:
    """The SCAN pattern that matches every slot under `key_prefix` and nothing else."""
    return f"{key_prefix}:" + "?" * 22


def _call_id_bytes(call_id: str | None) -> bytes:
    # Without a host call id, each check gets a random one, so that a retry
    # of this very check after a lost reply is still counted once.
    if call_id is None:
        return os.urandom(8)
    return hashlib.blake2b(_utf8(call_id), digest_size=8).digest()


def encode_call(call: PreparedCall, key_prefix: str, ttl_ms: int) -> tuple[str, tuple[bytes | str | int, ...]]:
    """KEYS[1] and ARGV for one check (see the header of lua/brake.lua)."""
    slot_id = bytes.fromhex(call.digest[:32]) + _call_id_bytes(call.call_id)
    return session_key(call.session_id, key_prefix), (
        slot_id,
        call.max_repeats,
        ttl_ms,
        call.tool_name[:TOOL_CHARS],
        call.session_id[:SESSION_CHARS],
    )


def decode_reply(reply: object) -> tuple[int, bool]:
    """The script's integer into (count, replayed); anything else is `ScriptReplyError`."""
    if not isinstance(reply, int) or isinstance(reply, bool) or reply < 4:
        raise ScriptReplyError(f"unexpected reply from the brake script: {type(reply).__name__}")
    return reply >> 2, bool(reply & 1)


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return "" if value is None else str(value)


def decode_state(
    fields: Sequence[object] | Mapping[bytes, object], pttl_ms: object
) -> SessionState | None:
    """A slot's HMGET reply (s, t, h, n, u) and PTTL as a `SessionState`; None if gone."""
    values = [fields.get(f) for f in FIELDS] if isinstance(fields, Mapping) else list(fields)
    session, tool, slot_id, count, updated = values
    if slot_id is None or count is None:
        return None
    raw_id = slot_id if isinstance(slot_id, bytes) else _text(slot_id).encode("latin-1", "replace")
    ttl = pttl_ms / 1000 if isinstance(pttl_ms, int) and pttl_ms >= 0 else None
    return SessionState(
        session_id=_text(session),
        tool_name=_text(tool),
        hash_prefix=raw_id[:6].hex(),
        count=int(_text(count)),
        ttl_seconds=ttl,
        updated_at=float(_text(updated) or 0),
    )
