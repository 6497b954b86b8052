"""The Redis commands the brake sends, as ACL DRYRUN probes and as ACL rules to grant.

`FEATURES` is the one table of what each feature needs: `doctor`'s probes,
the CLI's ACL hints and the README's minimal user are all built from it.
"""

from __future__ import annotations

import re

from .wire import FIELDS, script_source

# Sample arguments for ACL DRYRUN of the commands the script may run ({key}: a record key).
_SAMPLE_ARGS: dict[str, tuple[str, ...]] = {
    "HGET": ("{key}", "h"), "HSET": ("{key}", "h", "x"), "HMGET": ("{key}", "h"),
    "HDEL": ("{key}", "h"), "HINCRBY": ("{key}", "n", "1"), "PEXPIRE": ("{key}", "1000"),
    "EXPIRE": ("{key}", "10"), "SET": ("{key}", "x"), "TIME": (), "PING": (),
}


def script_commands() -> list[str]:
    """The commands lua/brake.lua runs (ACL checks each of them inside the script)."""
    found = re.findall(r"(?:redis\.p?call|rcall)\(\s*['\"](\w+)['\"]", script_source())
    return list(dict.fromkeys(name.upper() for name in found))


# Every command the brake and its operations send, by the feature that needs it ({key}: a record key,
# {pattern}: the SCAN pattern of records, {sha}/{source}: the script's, {argv}: a check's arguments).
# "checks" also needs what lua/brake.lua runs inside the script (`script_commands`).
FEATURES: dict[str, tuple[tuple[str, ...], ...]] = {
    "checks": (("EVALSHA", "{sha}", "1", "{key}", "{argv}"), ("SCRIPT", "LOAD", "{source}")),
    "inspect and list": (("HMGET", "{key}", *(f.decode() for f in FIELDS)), ("PTTL", "{key}"), ("TIME",),
                         ("SCAN", "0", "MATCH", "{pattern}", "COUNT", "500")),
    "clear": (("DEL", "{key}"),),
    "ping": (("PING",),),
    "the fleet view (written by checks)": (("HINCRBY", "{key}", "n", "1"), ("PEXPIRE", "{key}", "1000")),
    "the kill switch (read by checks, set by block --all)": (("GET", "{key}"), ("SET", "{key}", "x", "PX", "1000")),
    "stats and top": (("HGETALL", "{key}"),),
}


def needed_commands(key: str, pattern: str, sha: str, source: str) -> list[tuple[str, ...]]:
    """Every command the brake and its operations send (`FEATURES`), with sample arguments."""
    fill = {"{key}": (key,), "{pattern}": (pattern,), "{sha}": (sha,), "{source}": (source,),
            "{argv}": ("x" * 24, "3", "3600000", "tool", "session")}
    commands: list[tuple[str, ...]] = []
    for feature, sent in FEATURES.items():
        commands += [tuple(part for arg in command for part in fill.get(arg, (arg,))) for command in sent]
        if feature == "checks":  # and what the script runs
            commands += [(name, *(key if a == "{key}" else a for a in _SAMPLE_ARGS.get(name, ("{key}",))))
                         for name in script_commands()]
    unique: dict[str, tuple[str, ...]] = {}
    for command in commands:
        unique.setdefault(command_name(command), command)
    return list(unique.values())


def command_name(command: tuple[str, ...]) -> str:
    return " ".join(command[:2]) if command[0] == "SCRIPT" else command[0]


def needed_rules() -> str:
    """ACL rules granting every command the brake needs (keys not included)."""
    names = [command_name(c) for c in needed_commands("k", "k:*", "0" * 40, "")]
    return " ".join("+" + name.lower().replace(" ", "|") for name in names)


def grant_hint(user: str, prefix: str, commands: list[str]) -> str:
    rules = " ".join("+" + c.lower().replace(" ", "|") for c in commands)
    return f"ACL SETUSER {user} {rules} ~{prefix}:*  (and the same in your ACL file / on every node)"
