"""The `distbrake` command line (see README, "CLI")."""

from __future__ import annotations

import click

from . import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="distbrake")
def cli() -> None:
    """Inspect and clear the loop brake's sessions."""


def main() -> None:
    cli(prog_name="distbrake")
