"""The `doctor` command: run the doctor's checks, print them, exit 4 on a problem."""

from __future__ import annotations

import click

from .command_helpers import emit_json, json_option
from .doctor import Doctor
from .exit_codes import EXIT_BACKEND
from .global_options import App


@click.command("doctor", short_help='Diagnose connection, mode, script, permissions, config.')
@json_option
@click.pass_obj
def doctor_command(app: App, as_json: bool) -> None:
    """Diagnose the backend: connection, version, mode, latency, script, permissions, config.

    Exit 4 when something is wrong (each problem comes with its fix).
    The end-to-end check writes one probe key under the prefix and deletes it.
    """
    doctor = Doctor(app)
    doctor.run()
    if as_json:
        emit_json(doctor.to_json())
    else:
        doctor.print()
    if not doctor.ok:
        raise click.exceptions.Exit(EXIT_BACKEND)
