"""Values for the cross-process identity test (`tests/test_identity_processes.py`).

Run as `python -m tests.identity_cases` it prints, as one JSON object, the
call hash of every case, or `refused: <message>` when the hash refuses it.
The test runs it in several processes with different `PYTHONHASHSEED`s:
str hashing, and so the iteration order of a set of str, differs between
them. The secret in the refused values must never appear in a message.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import json
import uuid
from typing import Any

import pydantic
import pydantic.dataclasses

from distbrake import UnsupportedArgumentsError, call_hash

SECRET = "secret-value-7f3a"
# Enough members that two seeds practically never iterate them in the same order.
WORDS = [f"{SECRET}-{i}" for i in range(12)]


class Tags(pydantic.BaseModel):
    tags: set[str]


class FrozenIds(pydantic.BaseModel):
    ids: frozenset[int]


class Outer(pydantic.BaseModel):
    name: str
    inner: Tags


class DictOfSets(pydantic.BaseModel):
    groups: dict[str, set[str]]


class ListOfFrozensets(pydantic.BaseModel):
    items: list[frozenset[str]]


class AnyField(pydantic.BaseModel):
    extra: Any


class FrozensetKeys(pydantic.BaseModel):
    index: dict[frozenset[str], int]


@dataclasses.dataclass
class Box:
    members: set[str]


class HoldsBox(pydantic.BaseModel):
    box: Box


@dataclasses.dataclass
class HoldsModel:
    label: str
    model: Tags


@pydantic.dataclasses.dataclass
class PydanticDataclass:
    members: frozenset[str]


class Color(enum.Enum):
    RED = "red"


class Query(pydantic.BaseModel):
    q: str
    limit: int = 10
    tags: list[str] = []


class Filters(pydantic.BaseModel):
    ratio: float
    when: datetime.datetime
    color: Color
    ident: uuid.UUID
    note: str | None = None
    scores: dict[str, list[int]]
    pair: tuple[int, str]


class Search(pydantic.BaseModel):
    query: Query
    filters: Filters


class SortedTags(pydantic.BaseModel):
    """A set whose JSON form does not depend on iteration order: the model writes it sorted."""

    tags: set[str]

    @pydantic.field_serializer("tags")
    def _sorted(self, tags: set[str]) -> list[str]:
        return sorted(tags)


@dataclasses.dataclass
class Point:
    x: int
    y: float


@dataclasses.dataclass
class Route:
    name: str
    points: list[Point]
    meta: dict[str, Any]


def refused_cases() -> dict[str, tuple[Any, str]]:
    """name -> (a value whose JSON form would follow a set's iteration order, the type the error names)."""
    words = set(WORDS)
    tags = Tags(tags=words)
    return {
        "model-set": (tags, "set"),
        "model-frozenset": (FrozenIds(ids=frozenset({3, 11, 19, 27, 1, 9})), "frozenset"),
        "nested-model": (Outer(name="n", inner=tags), "set"),
        "dict-of-sets": (DictOfSets(groups={"a": words, "b": {"x"}}), "set"),
        "list-of-frozensets": (ListOfFrozensets(items=[frozenset(words)]), "frozenset"),
        "any-field-set": (AnyField(extra={"k": words}), "set"),
        "frozenset-keys": (FrozensetKeys(index={frozenset(words): 1}), "frozenset"),
        "model-holds-dataclass-set": (HoldsBox(box=Box(members=words)), "set"),
        "dataclass-holds-model": (HoldsModel(label="l", model=tags), "set"),
        "pydantic-dataclass": (PydanticDataclass(members=frozenset(words)), "frozenset"),
        "mapping-holds-model": ({"query": tags, "n": 1}, "set"),
        "list-holds-model": ([1, [tags]], "set"),
        "dataclass-set": (Box(members=words), "set"),
        "mapping-set": ({"k": words}, "set"),
    }


def accepted_cases() -> dict[str, Any]:
    """name -> an ordinary value: the same hash in every process."""
    filters = Filters(
        ratio=1.0, when=datetime.datetime(2024, 5, 6, 7, 8, 9, tzinfo=datetime.UTC), color=Color.RED,
        ident=uuid.UUID(int=42), scores={"b": [3, 1], "a": [2]}, pair=(1, "x"),
    )
    return {
        "model": Query(q="weather", tags=["b", "a"]),
        "nested-model": Search(query=Query(q="rain", limit=3), filters=filters),
        "sorted-set-model": SortedTags(tags=set(WORDS)),
        "dataclass": Route(name="r", points=[Point(1, 2.0), Point(3, 0.5)], meta={"z": 1, "a": [True, None]}),
        "mapping-of-models": {"first": Query(q="x"), "second": [Query(q="y", limit=1)]},
    }


def outcomes() -> dict[str, str]:
    """Every case's call hash, or "refused: <message>" (or "error: <type>" for any other error)."""
    results: dict[str, str] = {}
    cases = {f"refused/{name}": value for name, (value, _) in refused_cases().items()}
    cases.update({f"accepted/{name}": value for name, value in accepted_cases().items()})
    for name, value in cases.items():
        try:
            results[name] = call_hash("tool", value)
        except UnsupportedArgumentsError as error:
            results[name] = f"refused: {error}"
        except Exception as error:  # any other error is a failure the test shows by its type
            results[name] = f"error: {type(error).__name__}"
    return results


if __name__ == "__main__":
    print(json.dumps(outcomes(), sort_keys=True))
