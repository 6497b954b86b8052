"""`distbrake serve`: the HTTP server (distbrake/server/), run by uvicorn."""

from __future__ import annotations

import ipaddress
import os
import sys

import click

from ..hosts.run import HookOptions, open_brake
from .app import App, command

LOOPBACK_NAMES = ("localhost",)


def is_loopback(address: str) -> bool:
    if address in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False


@command("serve")
@click.option("--host", "bind", default="127.0.0.1", show_default=True, metavar="ADDRESS",
              help="Address to bind. Any address but loopback requires a token.")
@click.option("--port", default=8787, show_default=True, type=click.IntRange(0, 65535))
@click.option("--token", default=None, metavar="TOKEN",
              help="Bearer token every endpoint but /healthz requires (default: $DISTBRAKE_SERVE_TOKEN).")
@click.option("--max-body", default=1024 * 1024, show_default=True, type=click.IntRange(1024, 64 * 1024 * 1024),
              metavar="BYTES", help="Largest request body; a larger one gets 413.")
@click.option("--store", metavar="PATH", default=None,
              help="The streak file used without a URL (default: the one `distbrake hook` uses).")
def serve_command(app: App, bind: str, port: int, token: str | None, max_body: int, store: str | None,
                  as_json: bool) -> None:
    """Serve the brake over HTTP: hosts' hooks, a JSON check API, /healthz and /metrics.

    \b
    With no --url / DISTBRAKE_URL the streaks are the machine's hook streak file
    (shared with `distbrake hook`); with one, the team's Redis.
    """
    from .output import CliError

    token = token or os.environ.get("DISTBRAKE_SERVE_TOKEN") or None
    if not is_loopback(bind) and not token:
        raise CliError(f"--host {bind} is not a loopback address: a token is required (--token or "
                       "DISTBRAKE_SERVE_TOKEN)", 2, "usage")
    try:
        import uvicorn

        from ..server import create_app
    except ImportError:
        raise CliError("distbrake serve needs the server extra: pip install 'distbrake[server]'", 4,
                       "configuration") from None
    options = HookOptions(app.url, app.timeout, app.key_prefix, app.max_repeats, store=store)
    brake = open_brake(options)
    backend = getattr(brake.settings, "shown_url", None) if brake.settings.url else None
    backend = backend or f"file {brake.store.path}"
    server = create_app(brake, token=token, max_body=max_body, backend=backend)
    click.echo(f"distbrake serve: http://{bind}:{port} (backend: {backend}; token: {'yes' if token else 'no'})",
               err=True)
    try:
        uvicorn.run(server, host=bind, port=port, log_level="warning", access_log=False, server_header=False)
    finally:
        brake.close()
    sys.stdout.flush()
