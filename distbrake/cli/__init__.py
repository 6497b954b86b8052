"""The `distbrake` command line (see README, "CLI").

    distbrake [--url URL] [--timeout S] [--key-prefix P] [--max-repeats N] COMMAND ...

Commands: inspect, list, clear, hash, check, doctor, bench, demo. Every
command that reports takes `--json` (before or after the command name).

Exit codes (stable):

    0  ok (check: the call was allowed)
    1  not found (inspect: no such session)
    2  usage error (bad option or argument, invalid ARGS_JSON, clear --all without --yes)
    3  denied (check: the call would be the Nth identical one in a row)
    4  backend unreachable or misconfigured (connection, timeout, credentials,
       permissions, a bad URL or setting; doctor: something is wrong)
    70 internal error (a bug: please report it)

Errors are one line on stderr (with --json, also `{"error": {...}}` on
stdout), never a traceback, never a password.
"""

from __future__ import annotations

from .acl_requirements import needed_rules as needed_rules
from .acl_requirements import script_commands as script_commands
from .call_commands import parse_args_json as parse_args_json
from .command_group import cli
from .command_helpers import json_option as json_option
from .doctor import Doctor as Doctor
from .entry_point import main
from .exit_codes import EXIT_CODES
from .exit_codes import CliError as CliError
from .global_options import App as App
from .run_state import scrub as scrub
from .session_view import state_json as state_json

__all__ = ["EXIT_CODES", "cli", "main"]
