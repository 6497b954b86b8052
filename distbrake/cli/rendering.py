"""Rich output for people: consoles, tables, plain piped text, and hints on stderr."""

from __future__ import annotations

import os
import sys
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from .run_state import current_run, one_line


def make_console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    terminal = stream.isatty()
    # Colour and box drawing only on a terminal; piped output is plain, wide text.
    return Console(
        file=stream, highlight=False, emoji=False, soft_wrap=not terminal,
        width=None if terminal else int(os.environ.get("COLUMNS", "0") or 0) or 200,
    )


def make_table(*columns: str, title: str | None = None) -> Table:
    terminal = sys.stdout.isatty()
    return Table(
        *columns, title=title, box=box.SIMPLE_HEAD if terminal else None,
        show_edge=False, pad_edge=False, header_style="bold" if terminal else "",
        title_justify="left", title_style="bold" if terminal else "",
    )


def print_renderable(console: Console, renderable: Any) -> None:
    """Print a rich renderable; piped, without the padding rich puts at line ends."""
    if console.is_terminal:
        console.print(renderable)
        return
    with console.capture() as captured:
        console.print(renderable)
    lines = captured.get().splitlines()
    console.file.write("".join(line.rstrip() + "\n" for line in lines))


def note(text: str) -> None:
    """A hint for a human (stderr), never in --json output."""
    if not current_run.json:
        make_console(stderr=True).print(Text(one_line(text), style="dim"))
