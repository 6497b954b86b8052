"""The declared floors are the tested ones (issue 27, items 1 and 6).

`tests/constraints-floor.txt` pins the lowest supported release of each base dependency and of the extras
whose floors are tested (otel, prometheus, and the test extra's opentelemetry-sdk); `.ci/run` installs the
project with it and runs the core tests there. `tests/constraints-floor-extras.txt` pins every other extra's
dependencies at their floors, installed together (the adapter and gateway tests run there). Each pin must be the
floor `pyproject.toml` declares, and every declared floor must be pinned by one of them; redis-py
must be capped below its next major (the brake uses private internals of it), and the classifiers must name
every Python that `.ci/run` tests.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.adapters import SEPARATE_ENVIRONMENTS  # extras that cannot share the others' environment

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
CONSTRAINTS = ROOT / "tests" / "constraints-floor.txt"
EXTRAS_CONSTRAINTS = ROOT / "tests" / "constraints-floor-extras.txt"
OWN_CONSTRAINTS = ROOT / "tests" / "constraints-floor-own.txt"
#: The Pythons .ci/run tests: its own (3.11, the machine's) and the matrix's.
CI_PYTHONS = ("3.11", "3.12", "3.13")


def pins(path: Path = CONSTRAINTS) -> dict[str, Version]:
    found = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            found[canonicalize_name(name)] = Version(version)
    return found


def floors() -> dict[str, Requirement]:
    project = PYPROJECT["project"]
    extras = project["optional-dependencies"]
    requirements = [*project["dependencies"], *extras["otel"], *extras["prometheus"], *extras["test"]]
    return {canonicalize_name(r.name): r for r in map(Requirement, requirements)}


def lower_bound(requirement: Requirement) -> Version:
    (bound,) = [s for s in requirement.specifier if s.operator == ">="]
    return Version(bound.version)


def test_every_pin_is_the_declared_floor() -> None:
    declared = floors()
    pinned = pins()
    assert set(pinned) >= {"redis", "hiredis", "fakeredis", "pydantic", "pydantic-settings", "orjson", "click",
                           "rich", "opentelemetry-api", "opentelemetry-sdk", "prometheus-client"}
    for name, version in pinned.items():
        assert lower_bound(declared[name]) == version, (name, str(declared[name].specifier), str(version))
    base = {canonicalize_name(Requirement(r).name) for r in PYPROJECT["project"]["dependencies"]}
    assert base <= set(pinned), base - set(pinned)  # every base dependency has its floor tested


def test_every_extras_floor_is_pinned_in_a_floor_cell() -> None:
    """Every declared floor, of every extra that can share one environment, is the release a floor cell installs:
    constraints-floor.txt's (base, otel, prometheus, opentelemetry-sdk) or constraints-floor-extras.txt's."""
    floor_cell, extras_cell = pins(), pins(EXTRAS_CONSTRAINTS)
    extras = PYPROJECT["project"]["optional-dependencies"]
    checked = 0
    for extra, requirements in extras.items():
        if extra == "all" or extra in SEPARATE_ENVIRONMENTS:
            continue
        for requirement in map(Requirement, requirements):
            name = canonicalize_name(requirement.name)
            floor = lower_bound(requirement)
            assert floor in (floor_cell.get(name), extras_cell.get(name)), (extra, str(requirement))
            checked += 1
    assert checked > 30
    for name, version in floor_cell.items():  # the floors cell's base pins are the extras cell's too where allowed
        assert extras_cell[name] >= version, name


def test_every_floor_of_an_extra_in_its_own_environment_is_pinned_for_its_floor_cell() -> None:
    """crewai's and strands' floors are the releases .ci/run's floor cell of each installs (beside its newest)."""
    extras = PYPROJECT["project"]["optional-dependencies"]
    requirements = [Requirement(text) for extra in SEPARATE_ENVIRONMENTS for text in extras[extra]]
    declared = {canonicalize_name(r.name): lower_bound(r) for r in requirements}
    assert declared == pins(OWN_CONSTRAINTS)
    run = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert all(f"{extra}:floor" in run and f"{extra}:newest" in run for extra in SEPARATE_ENVIRONMENTS)
    assert 'constraints=(-c tests/constraints-floor-own.txt)' in run


def test_redis_py_is_capped_below_its_next_major() -> None:
    redis = floors()["redis"]
    assert Version("8.99") in redis.specifier and Version("9.0") not in redis.specifier


def test_classifiers_and_readme_name_every_python_ci_tests() -> None:
    classifiers = PYPROJECT["project"]["classifiers"]
    version = re.compile(r"Programming Language :: Python :: (3\.\d+)")
    named = {match.group(1) for c in classifiers if (match := version.fullmatch(c))}
    assert named == set(CI_PYTHONS)
    run = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert all(f'"{version}"' in run or f" {version}" in run for version in CI_PYTHONS[1:])
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "Python 3.11, 3.12 and 3.13" in readme
