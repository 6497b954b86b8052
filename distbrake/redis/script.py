"""The brake's Lua script as an object: its text, its SHA, its packed EVALSHA head, and load-on-NOSCRIPT.

Modelled on redis-py's `Script`: EVALSHA first, and on NOSCRIPT (a flushed
script cache, a restarted or failed-over server) SCRIPT LOAD and send again
(`Script.resend` for one command, `Script.aresend` for an asyncio batch: the
one reload-and-resend rule of the sync and asyncio brakes). Each brake has a
`Script` of its own, chosen when it is built (`script_for`): the text a server
needs may differ from `lua/brake.lua` by a prefix (a *variant*, e.g. a
shebang line some managed servers want), and its SHA and the bytes packed
from it are the brake's, never the process's.

What Redis runs is `lua/brake.lua` with the names of its wire-contract block
folded into their values (`fold_contract`): Redis runs a script's body anew
for every check, so each `local` of that block (about 60) would cost every
check server CPU, and a literal costs nothing once compiled (Lua also folds
`H_TTL_END + 1` then). The file keeps the names, the twin of `contract.py`.
"""

from __future__ import annotations

import copy
import hashlib
import re
from collections.abc import Awaitable, Callable, Sequence
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import redis.exceptions

__all__ = [
    "CONTRACT_BLOCK", "HOST_VARIANTS", "SCRIPT_FILE", "VARIANTS", "Script", "brake_script", "bulk", "contract_block",
    "fold_contract", "script_file", "script_for", "script_source", "variant_for_hosts",
]

SCRIPT_FILE = "brake.lua"
#: The comment that starts the script's wire-contract block: `local NAME, ... = value, ...` lines, up to the first
#: empty line.
CONTRACT_BLOCK = "-- The wire contract"
_CONTRACT_LINE = re.compile(r"local ([\w, ]+) = (.+?)(\s+--.*)?")
# What may hold a name in the script's code: a comment or a string literal (both left as they are), or a name.
_LONG_BRACKET = re.compile(r"\[=*\[|\]=+\]")  # a long bracket's opening (any level), or a closing of level > 0
_LUA_TOKEN = re.compile(r"""--\[\[.*?\]\]|--[^\n]*|'(?:\\.|[^'\\\n])*'|"(?:\\.|[^"\\\n])*"|\b[A-Za-z_]\w*\b""", re.S)

T = TypeVar("T")
Q = TypeVar("Q")

#: The text put before `lua/brake.lua` for each variant of the script a server may need ("" for Redis itself).
#: Upstash runs a script under a global lock (no other command runs meanwhile) unless its shebang line sets
#: `allow-key-locking`: then it locks only the keys in KEYS, and the brake's script touches only KEYS[1].
#: Redis (7.0 and later) and Valkey refuse that flag ("Unexpected flag in script shebang"): only Upstash gets it.
VARIANTS: dict[str, str] = {"redis": "", "upstash": "#!lua flags=allow-key-locking\n"}

#: Services known by their endpoint's host name (the documented form: `<name>.upstash.io`), and their variant.
HOST_VARIANTS: tuple[tuple[str, str], ...] = ((".upstash.io", "upstash"),)


def bulk(value: bytes) -> bytes:
    """A RESP bulk string."""
    return b"$%d\r\n%s\r\n" % (len(value), value)


def _nothing() -> None:
    pass


class Script:
    """One text of the brake's script, as one brake sends it (see the module's docstring)."""

    __slots__ = ("evalsha_head", "load_command", "on_load", "sha", "text", "variant")

    def __init__(self, text: str, variant: str = "redis", on_load: Callable[[], None] = _nothing) -> None:
        self.text = text
        self.variant = variant
        self.sha = hashlib.sha1(text.encode("utf-8")).hexdigest()  # Redis names scripts by SHA1
        # `EVALSHA <sha> 1` in wire format: what every packed check starts with, after the array's length.
        self.evalsha_head = b"$7\r\nEVALSHA\r\n" + bulk(self.sha.encode("ascii")) + b"$1\r\n1\r\n"
        # `SCRIPT LOAD <text>` in wire format (after a NOSCRIPT reply on a connection of our own).
        self.load_command = b"*3\r\n$6\r\nSCRIPT\r\n$4\r\nLOAD\r\n" + bulk(text.encode("utf-8"))
        self.on_load = on_load  # told of each load after a NOSCRIPT (telemetry)

    def __repr__(self) -> str:
        return f"Script(variant={self.variant!r}, sha={self.sha[:12]!r})"

    def telling(self, on_load: Callable[[], None]) -> Script:
        """The same script, telling `on_load` of each load after a NOSCRIPT (a brake's telemetry)."""
        told = copy.copy(self)
        told.on_load = on_load
        return told

    def resend(self, send: Callable[[], T], load: Callable[[], object]) -> T:
        """After `send` was answered NOSCRIPT: load the script (`load`) and `send` again."""
        self.on_load()
        load()
        return send()

    def run(self, send: Callable[[], T], load: Callable[[], object]) -> T:
        """`send`, and on NOSCRIPT, `resend` (for paths off the hot one: the hot ones inline the try)."""
        try:
            return send()
        except redis.exceptions.NoScriptError:
            return self.resend(send, load)

    async def aresend(
        self, batch: Sequence[Q], replies: list[Any], send: Callable[[list[Q]], Awaitable[list[Any]]],
        load: Callable[[], Awaitable[object]],
    ) -> list[Any]:
        """`replies` to `batch`, with each NOSCRIPT among them replaced: the script loaded once (`load`), and
        those of `batch` sent again (`send`)."""
        missing = [i for i, reply in enumerate(replies) if isinstance(reply, redis.exceptions.NoScriptError)]
        if missing:  # a flushed or new server: load the script, send those checks again
            self.on_load()
            await load()
            for index, reply in zip(missing, await send([batch[i] for i in missing]), strict=True):
                replies[index] = reply
        return replies


@lru_cache(maxsize=1)
def script_file() -> str:
    """The text of `lua/brake.lua`: from the installed wheel, else the source tree."""
    packaged = resources.files("distbrake").joinpath("lua", SCRIPT_FILE)
    if packaged.is_file():
        return packaged.read_text(encoding="utf-8")
    tree = Path(__file__).resolve().parents[2] / "lua" / SCRIPT_FILE
    return tree.read_text(encoding="utf-8")


@lru_cache(maxsize=1)
def script_source() -> str:
    """The script as Redis runs it: `lua/brake.lua`, its contract's names folded into their values."""
    return fold_contract(script_file())


def _split(text: str) -> tuple[str, str, str]:
    """The script `text` cut at its wire-contract block: what comes before the block's lines (its title line
    included), the block's lines, and the code after the empty line that ends them."""
    start, rest = text.split(CONTRACT_BLOCK, 1)
    title, rest = rest.split("\n", 1)
    block, code = rest.split("\n\n", 1)
    return f"{start}{CONTRACT_BLOCK}{title}\n", block, code


def contract_block(text: str) -> dict[str, str]:
    """The names of the wire-contract block of the script `text`, each with its value as the Lua text writes it."""
    names: dict[str, str] = {}
    for line in _split(text)[1].splitlines():
        found = _CONTRACT_LINE.fullmatch(line)
        if found is None:
            raise ValueError(f"not a line of the wire contract: {line!r}")
        values = [value.strip() for value in found.group(2).split(",")]
        names.update(zip((name.strip() for name in found.group(1).split(",")), values, strict=True))
    return names


def fold_contract(text: str) -> str:
    """The script `text` with each name of its wire-contract block replaced by its value in the code after the
    block (not in comments or string literals), the block's lines left empty: the same lines, so an error's line
    number is the file's."""
    names = contract_block(text)
    head, block, code = _split(text)
    bare = _LUA_TOKEN.sub(lambda token: "" if token.group(0)[0] in "-'\"" else token.group(0), code)
    if _LONG_BRACKET.search(bare):  # a long string, or what a comment of level > 0 leaves: text not told apart
        raise ValueError("a long bracket in the script's code: the contract's names cannot be folded around it")

    def value(token: re.Match[str]) -> str:
        return names.get(token.group(0), token.group(0))

    return head + "\n" * (block.count("\n") + 2) + _LUA_TOKEN.sub(value, code)


@lru_cache(maxsize=len(VARIANTS) + 1)
def brake_script(variant: str = "redis") -> Script:
    """The script of `variant` (see VARIANTS), shared, telling nobody of its loads."""
    return Script(VARIANTS[variant] + script_source(), variant)


def variant_for_hosts(hosts: Sequence[tuple[str, int]]) -> str:
    """The variant of the script for a server at `hosts` (a URL's (host, port) pairs): "redis" unless every host
    is a service of HOST_VARIANTS."""
    names = [host.lower().rstrip(".") for host, _ in hosts]
    for suffix, variant in HOST_VARIANTS:
        if names and all(name.endswith(suffix) for name in names):
            return variant
    return "redis"


def script_for(variant: str, on_load: Callable[[], None]) -> Script:
    """A brake's own script: the text of `variant`, telling `on_load` of each load after a NOSCRIPT."""
    return brake_script(variant).telling(on_load)
