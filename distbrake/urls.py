"""Backend URLs: the schemes distbrake understands, parsed without I/O.

    memory://[name]                          embedded fakeredis, shared in-process by name
    redis://[[user]:password@]host[:port][/db][?options]
    rediss://...                             the same over TLS (ssl_* options)
    redis+unix:///path/to.sock[?db=N]        also unix:///path
    redis+cluster://[[user]:pw@]h:p[,h:p...][?options]
    redis+sentinel://[[user]:pw@]h:p[,h:p...]/service[/db][?options]

Nothing here ever puts a password into an error message: `redact_url` is
used for every URL that is shown.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, unquote, urlsplit

from .errors import InvalidURLError

__all__ = ["ParsedURL", "parse_url", "redact_url"]

SCHEMES = {
    "memory": "memory",
    "redis": "redis",
    "rediss": "redis",
    "unix": "unix",
    "redis+unix": "unix",
    "redis+cluster": "cluster",
    "rediss+cluster": "cluster",
    "redis+sentinel": "sentinel",
    "rediss+sentinel": "sentinel",
}

# User info ends at the last "@" before the path or query (so "@" and "#" may stand in a password).
_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)([^/?]*)@")
# For showing only: everything up to the last "@" anywhere, scheme or no scheme, is user info,
# so a malformed URL (an unescaped "/" or "?" in the password, "redis//", no scheme) is hidden too.
_SHOWN_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)?(.*)@", re.DOTALL)
_SECRET_OPTION = re.compile(r"(?i)([?&][^=&]*(?:pass|secret|token|auth)[^=&]*=)[^&]*")
_DIGITS = re.compile(r"[0-9]{1,9}")


def redact_url(url: str) -> str:
    """The URL with any password replaced by `***` (user names are kept).

    Option values whose name speaks of a password, secret, token or auth
    (`sentinel_password=`) are hidden as well.
    """
    url = _SECRET_OPTION.sub(r"\1***", url)
    match = _SHOWN_USERINFO.match(url)
    if match is None:
        return url
    scheme, userinfo = match.group(1) or "", match.group(2)
    user, sep, _password = userinfo.partition(":")
    shown = f"{user}:***" if sep else user  # without ":" redis-py reads a user name
    return scheme + shown + "@" + url[match.end():]


def parse_number(text: str) -> int | None:
    """`text` as an int if it is 1 to 9 ASCII digits (`str.isdigit` also takes "²" and "٣"), else None."""
    return int(text) if _DIGITS.fullmatch(text) else None


@dataclass(frozen=True)
class ParsedURL:
    """What a URL asks for, with no connection made."""

    connector: str  # the backend kind, a key of redis/connect.CONNECTORS: memory | redis | unix | cluster | sentinel
    scheme: str
    tls: bool
    hosts: tuple[tuple[str, int], ...] = ()
    path: str = ""  # memory name, unix socket path, or sentinel service
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    options: dict[str, str] = field(default_factory=dict, repr=False)  # may hold a sentinel_password
    redacted: str = ""  # the URL with every secret masked (what repr shows of the options)


def _bad(url: str, why: str) -> InvalidURLError:
    return InvalidURLError(f"invalid backend URL {redact_url(url)!r}: {why}")


def _hosts(url: str, netloc: str, default_port: int) -> tuple[tuple[str, int], ...]:
    hosts = []
    for raw in netloc.split(","):
        part = raw.strip()
        if not part:
            raise _bad(url, "empty host in host list")
        if part.startswith("["):
            host, _, rest = part[1:].partition("]")
            port_text = rest.removeprefix(":")
        else:
            host, _, port_text = part.rpartition(":") if ":" in part else (part, "", "")
        if not host:
            raise _bad(url, "missing host")
        if port_text:
            port_number = parse_number(port_text)
            if port_number is None or not 0 < port_number < 65536:
                raise _bad(url, "port must be a number from 1 to 65535")
            port = port_number
        else:
            port = default_port
        hosts.append((host, port))
    return tuple(hosts)


def _db(url: str, text: str) -> int:
    text = text.strip("/")
    if not text:
        return 0
    number = parse_number(text)
    if number is None:
        raise _bad(url, "database must be a number")
    return number


def parse_url(url: str) -> ParsedURL:
    """Parse a backend URL, or raise `InvalidURLError` (password redacted)."""
    if not isinstance(url, str) or "://" not in url:
        raise _bad(str(url), f"expected one of {', '.join(s + '://' for s in SCHEMES)}")
    scheme = url.split("://", 1)[0].lower()
    connector = SCHEMES.get(scheme)
    if connector is None:
        raise _bad(url, f"unknown scheme {scheme!r}; use one of {', '.join(s + '://' for s in SCHEMES)}")
    rest = url.split("://", 1)[1]
    userinfo = ""
    match = _USERINFO.match(url)
    if match is not None:
        userinfo = match.group(2)
        rest = url[match.end():]
    username: str | None = None
    password: str | None = None
    if userinfo:
        user, sep, pw = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(pw) if sep else None
    netloc, _, tail = rest.partition("/") if "/" in rest.split("?", 1)[0] else (rest.split("?", 1)[0], "", "")
    query = urlsplit("x://h/" + rest).query if "?" in rest else ""
    tail = tail.split("?", 1)[0]
    options = dict(parse_qsl(query, keep_blank_values=True))
    tls = scheme.startswith("rediss")
    redacted = redact_url(url)
    if connector == "memory":
        name = (netloc + ("/" + tail if tail else "")) or "default"
        return ParsedURL(connector, scheme, False, path=name, options=options, redacted=redacted)
    if connector == "unix":
        path = "/" + tail if netloc == "" else netloc + ("/" + tail if tail else "")
        if not path or path == "/":
            raise _bad(url, "missing socket path")
        db_text = options.pop("db", "0")
        return ParsedURL(
            connector, scheme, False, path=unquote(path), db=_db(url, db_text), username=username,
            password=password, options=options, redacted=redacted,
        )
    if not netloc:
        raise _bad(url, "missing host")
    default_port = 26379 if connector == "sentinel" else 6379
    hosts = _hosts(url, netloc, default_port)
    if connector == "redis" and len(hosts) > 1:
        raise _bad(url, "several hosts need redis+cluster:// or redis+sentinel://")
    service = ""
    db = 0
    if connector == "sentinel":
        service, _, db_text = tail.partition("/")
        if not service:
            raise _bad(url, "missing sentinel service name (redis+sentinel://h:p/SERVICE)")
        db = _db(url, db_text)
    elif connector == "cluster":
        if tail.strip("/") not in ("", "0"):
            raise _bad(url, "Redis Cluster has only database 0")
    else:
        db = _db(url, tail)
    return ParsedURL(
        connector, scheme, tls, hosts=hosts, path=service, db=db, username=username,
        password=password, options=options, redacted=redacted,
    )
