"""`distbrake proxy`: an MCP server in front of one upstream MCP server, the brake on every tool call.

    distbrake proxy [OPTIONS] -- COMMAND [ARGS...]    (upstream over stdio)
    distbrake proxy [OPTIONS] --upstream URL          (upstream over Streamable HTTP)

Served over stdio (the default) or Streamable HTTP (`--http HOST:PORT`, path
`/mcp`; port 0 picks a free one). The address it serves is said on stderr
once it accepts connections (`distbrake proxy: serving http://...`);
stdout is the MCP channel under stdio. The brake is the one of the global
options (`--url`, `DISTBRAKE_URL`, `DISTBRAKE_TOOLS`, ...). The session
rule is `distbrake.gateways.sessions` (README "Gateways").
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from typing import Any

import anyio
import click

from .app import App, command
from .output import EXIT_USAGE, CliError


def _listen(address: str) -> socket.socket:
    host, sep, port_text = address.rpartition(":")
    if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise CliError("--http takes HOST:PORT (for example 127.0.0.1:8765)", EXIT_USAGE, "usage")
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, int(port_text)))
    except OSError as error:
        listener.close()
        raise CliError(f"--http {address}: cannot listen there ({error.strerror})", EXIT_USAGE, "usage") from None
    listener.listen(128)
    return listener


def _log_to_stderr() -> None:
    # The CLI keeps library logs quiet; a long-running proxy says its warnings (the shared-session
    # fallback, backend failures) on stderr, never on stdout (the MCP channel under stdio).
    log = logging.getLogger("distbrake")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.WARNING)


@command("proxy")
@click.option("--upstream", metavar="URL", default=None,
              help="The upstream MCP server's Streamable HTTP URL (instead of a command after --).")
@click.option("--http", "http", metavar="HOST:PORT", default=None,
              help="Serve Streamable HTTP on HOST:PORT (path /mcp) instead of stdio.")
@click.option("--session-from", metavar="PATH", default=None,
              help="A dotted _meta path naming the session (checked first), e.g. agent.thread.")
@click.option("--require-session", is_flag=True, default=False,
              help="Refuse a call that names no session (else: one shared session, with a warning).")
@click.option("--scope", type=click.Choice(["run", "conversation"]), default="run", show_default=True,
              help="Whether a client's run id (run_id, Codex turn_id) makes each run its own streak.")
@click.option("--name", default="distbrake-proxy", show_default=True, help="The proxy's MCP server name.")
@click.argument("upstream_command", nargs=-1, type=click.UNPROCESSED, metavar="[-- COMMAND ARGS...]")
def proxy_command(
    app: App, upstream: str | None, http: str | None, session_from: str | None, require_session: bool,
    scope: str, name: str, upstream_command: tuple[str, ...], as_json: bool,
) -> None:
    """Serve one upstream MCP server with the loop brake in front of every tools/call."""
    if (upstream is None) == (not upstream_command):
        raise CliError("give the upstream either as a command after -- or as --upstream URL, not both",
                       EXIT_USAGE, "usage")
    from ..gateways.sessions import GatewaySessions

    settings = app.settings()
    sessions = GatewaySessions(session_from=session_from, scope=scope,  # type: ignore[arg-type]  # click.Choice
                               require_session=require_session or settings.require_session)
    listener = _listen(http) if http is not None else None
    _log_to_stderr()
    anyio.run(_serve, app, upstream, upstream_command, sessions, name, listener)


async def _serve(app: App, upstream: str | None, upstream_command: tuple[str, ...], sessions: Any, name: str,
                 listener: socket.socket | None) -> None:
    from fastmcp.client.transports import StdioTransport

    from ..gateways.proxy import build_proxy
    from ..redis.aio import AsyncDistributedBrake

    target: Any = upstream
    if upstream is None:
        command_name, *arguments = upstream_command
        target = StdioTransport(command_name, arguments, env=dict(os.environ), cwd=os.getcwd())
    brake = AsyncDistributedBrake.from_url(settings=app.settings(), otel=False)
    try:
        proxy = build_proxy(target, brake, sessions=sessions, name=name)
        if listener is None:
            await proxy.run_stdio_async(show_banner=False, log_level="WARNING")
            return
        host, port = listener.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        click.echo(f"distbrake proxy: serving http://{shown}:{port}/mcp", err=True)
        await proxy.run_http_async(show_banner=False, transport="http", sockets=[listener],
                                   host=host, port=port, log_level="warning")
    finally:
        await brake.aclose()
