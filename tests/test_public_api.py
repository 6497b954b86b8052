"""The public API is a contract: `distbrake.__all__` is exactly the documented list.

As httpx's `test_exported_members`: a name added to or dropped from the
package's exports fails here until the README's Reference and this list
agree. Implementation modules are private by the rule in `distbrake`'s
docstring; no library module imports another module's `_private` name.
"""

from __future__ import annotations

import ast
import pathlib
import re

import distbrake

PACKAGE = pathlib.Path(distbrake.__file__).parent
README = PACKAGE.parent / "README.md"

DOCUMENTED = [
    "AsyncDistributedBrake", "BrakeHandle", "BrakeHealth", "BrakeOptions", "BrakeSettings",
    "BrakeUnavailableError", "ConfigurationError", "DECIDED_BY", "DEFAULT_URL", "DecidedBy", "DistbrakeError",
    "DistributedBrake", "EventLoopError", "FailurePolicy", "InvalidMaxRepeatsError", "InvalidURLError",
    "LoopBrake", "LoopBrakeError", "LoopBrakeHalt", "MissingSessionError", "ScriptReplyError", "SessionState",
    "ToolRules",
    "UnsupportedArgumentsError", "Verdict", "__version__", "bind_session", "call_hash", "canonical_json",
    "decorate_tool", "hash_prefix", "install", "normalize_max_repeats", "resolve_max_repeats",
    "resolve_session", "session_key", "wrap_execute",
]


def test_exported_members_are_the_documented_list() -> None:
    assert sorted(distbrake.__all__) == sorted(DOCUMENTED)
    for name in distbrake.__all__:
        assert hasattr(distbrake, name), name


def test_every_public_name_is_in_the_readme_reference() -> None:
    text = README.read_text(encoding="utf-8")
    reference = text[text.index("\n# Reference\n"):]
    missing = [name for name in DOCUMENTED if name != "__version__" and f"`{name}" not in reference]
    assert missing == []


def test_decided_by_values_are_the_documented_vocabulary() -> None:
    assert distbrake.DECIDED_BY == ("in-process", "redis", "fallback", "fail-open", "exempt")


def test_no_library_module_imports_another_modules_private_name() -> None:
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or node.level):
                offenders += [
                    f"{path.relative_to(PACKAGE)}: {alias.name}"
                    for alias in node.names
                    if re.match(r"_[a-z]", alias.name)
                ]
    assert offenders == []


def test_every_module_says_its_one_job_in_its_first_docstring_line() -> None:
    for path in PACKAGE.rglob("*.py"):
        if path.name == "__main__.py":
            continue
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
        assert doc, f"{path.relative_to(PACKAGE)} has no docstring"
        assert doc.splitlines()[0].strip(), path
