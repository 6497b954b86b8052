"""The call identity is the same in every process: unordered collections are refused, wherever they hide.

Python randomises str hashing per process (`PYTHONHASHSEED`), so a set of
str iterates in a different order in every worker. pydantic's
`model_dump(mode="json")` writes a set as a list in that order: a model with
a set field hashed differently in every process, so workers never shared its
streak. Such values are now refused with `UnsupportedArgumentsError` naming
the type (never the value), as a set among plain arguments always was;
ordinary models and dataclasses keep their hashes, the same in every process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pydantic
import pytest

from distbrake import UnsupportedArgumentsError, call_hash
from tests import identity_cases
from tests.identity_cases import SECRET, accepted_cases, refused_cases

ROOT = Path(__file__).resolve().parent.parent
SEEDS = ["0", "1", "2", "3", "4"]

# The hashes of the ordinary values, as they were before unordered collections were refused:
# refusing those must not move any other hash.
PINNED = {
    "accepted/model": "1f3a542a6f72c06738136b8346daa3a737cb5c19a86312093ac73d766ee23232",
    "accepted/nested-model": "f6204d832bb52141057150459f51725469c5749e5f9c23727cb944cd10b1be47",
    "accepted/sorted-set-model": "ed7cb97ad8d9053c4a1ac8d2eb41bf2eaa39674e97a6b888649bc2e0de190455",
    "accepted/dataclass": "728b9fe32474a65cc4385ef83745f283f35832926bad2965d3fd99cc6fe043e7",
    "accepted/mapping-of-models": "8752505d7378cd8e1a9b909fe940537e46308df37920e1c0809d80f3a1897b4f",
}


@pytest.fixture(scope="module")
def by_seed() -> dict[str, dict[str, str]]:
    """`python -m tests.identity_cases` in one process per seed (run side by side): seed -> outcomes."""
    runs = {}
    for seed in SEEDS:
        env = {**os.environ, "PYTHONHASHSEED": seed}
        runs[seed] = subprocess.Popen(
            [sys.executable, "-m", "tests.identity_cases"], cwd=ROOT, env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
        )
    finished = {seed: process.communicate(timeout=120) for seed, process in runs.items()}
    for seed, (_, err) in finished.items():
        assert runs[seed].returncode == 0, err.decode(errors="replace")
    return {seed: json.loads(out) for seed, (out, _) in finished.items()}


def test_the_seeds_really_change_set_order() -> None:
    """The premise: two of these seeds iterate the same set of str in different orders."""
    script = f"print(list(set({identity_cases.WORDS!r})))"
    orders = {
        subprocess.run(
            [sys.executable, "-c", script], env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True, check=True, timeout=60,
        ).stdout
        for seed in SEEDS
    }
    assert len(orders) > 1


@pytest.mark.parametrize("name", sorted(refused_cases()))
def test_unordered_collections_are_refused_in_every_process(name: str, by_seed: dict[str, dict[str, str]]) -> None:
    _, type_name = refused_cases()[name]
    for seed, outcomes in by_seed.items():
        outcome = outcomes[f"refused/{name}"]
        assert outcome.startswith("refused: "), f"seed {seed}: hashed to {outcome[:12]} instead of being refused"
        assert repr(type_name) in outcome
        assert SECRET not in outcome


@pytest.mark.parametrize("name", sorted(accepted_cases()))
def test_ordinary_models_and_dataclasses_hash_the_same_in_every_process(
    name: str, by_seed: dict[str, dict[str, str]]
) -> None:
    key = f"accepted/{name}"
    assert {outcomes[key] for outcomes in by_seed.values()} == {PINNED[key]}
    assert call_hash("tool", accepted_cases()[name]) == PINNED[key]  # and in this process


@pytest.mark.parametrize("name", ["model", "nested-model", "sorted-set-model"])
def test_a_model_still_hashes_as_its_json_dump(name: str) -> None:
    model = accepted_cases()[name]
    assert call_hash("tool", model) == call_hash("tool", model.model_dump(mode="json"))


@pytest.mark.parametrize("name", sorted(refused_cases()))
def test_the_refusal_names_the_type_never_the_value(name: str) -> None:
    value, type_name = refused_cases()[name]
    with pytest.raises(UnsupportedArgumentsError) as caught:
        call_hash("tool", value)
    assert isinstance(caught.value, TypeError)
    assert repr(type_name) in str(caught.value)
    for text in (str(caught.value), repr(caught.value)):
        assert SECRET not in text
    chained: BaseException | None = caught.value
    while chained is not None:  # nothing in the chain holds the value either
        assert SECRET not in str(chained) and SECRET not in repr(chained.args)
        chained = chained.__cause__ or chained.__context__


def test_a_model_pydantic_cannot_write_as_json_is_refused_without_its_value() -> None:
    class Opaque:
        def __repr__(self) -> str:
            return SECRET

    class Holder(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(arbitrary_types_allowed=True)
        thing: Opaque

    with pytest.raises(UnsupportedArgumentsError, match="'Holder'") as caught:
        call_hash("tool", Holder(thing=Opaque()))
    chained: BaseException | None = caught.value
    while chained is not None:
        assert SECRET not in str(chained)
        chained = chained.__cause__ or chained.__context__


def test_an_empty_set_in_a_model_is_refused_too() -> None:
    """Refused by type, not by luck: the rule does not depend on the members."""
    class Empty(pydantic.BaseModel):
        tags: set[str]

    with pytest.raises(UnsupportedArgumentsError, match="'set'"):
        call_hash("tool", Empty(tags=set()))


def test_deep_models_stay_a_clear_error_or_a_hash() -> None:
    class Node(pydantic.BaseModel):
        child: Node | None = None
        tags: Any = None

    deep = Node()
    for _ in range(60):
        deep = Node(child=deep)
    assert len(call_hash("tool", deep)) == 64
    deep_set = Node(tags={"x"})
    for _ in range(60):
        deep_set = Node(child=deep_set)
    with pytest.raises(UnsupportedArgumentsError, match="'set'"):
        call_hash("tool", deep_set)
