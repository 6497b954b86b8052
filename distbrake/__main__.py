"""`python -m distbrake` (and the `distbrake` script) run the CLI.

`distbrake hook <host> ...` runs before any other import: a coding agent starts
it before every tool call, so it skips click when it can (hosts/command.py).
"""

import sys


def main() -> None:
    """The `distbrake` console script."""
    if sys.argv[1:2] == ["hook"]:
        from .hosts.command import fast

        code = fast(sys.argv[2:])
        if code is not None:
            sys.exit(code)
    from .cli import main as cli_main

    cli_main()


if __name__ == "__main__":  # pragma: no cover
    main()
