"""Run-wide state of one CLI invocation: output mode, backend, and the secrets to keep out of every message."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import quote, unquote

from ..errors import DistbrakeError
from ..urls import parse_url, redact_url


@dataclass
class RunState:
    """What this run prints (text or JSON), which backend it talks to, and what to keep secret."""

    json: bool = False
    secrets: set[str] = field(default_factory=set)
    backend: str = "memory://"
    timeout: float = 0.5


current_run = RunState()

_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")


def remember_secrets(url: str | None) -> None:
    """Note the password (and sentinel password) of `url`, in every spelling a message may use."""
    if not url:
        return
    try:
        parsed = parse_url(url)
    except DistbrakeError:
        match = re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://[^@/?#]*?:([^@/?#]*)@", url)
        candidates = [match.group(1)] if match else []
    else:
        candidates = [parsed.password or "", parsed.options.get("sentinel_password", "")]
    for secret in candidates:
        if len(secret) >= 3:
            current_run.secrets.update({secret, unquote(secret), quote(secret, safe="")})


def scrub(text: str) -> str:
    """`text` with URL passwords redacted and every known secret replaced by ***."""
    text = _URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)), text)
    for secret in sorted(current_run.secrets, key=len, reverse=True):
        if secret:
            text = text.replace(secret, "***")
    return text


def one_line(text: str) -> str:
    """`text` scrubbed and on one line, as every message the CLI prints is."""
    return scrub(" ".join(str(text).split()))
