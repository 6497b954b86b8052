"""The generic registry seams: install() and dispose() (SPEC §7)."""

from __future__ import annotations

from typing import Any

import pytest

from distbrake import AsyncDistributedBrake, DistributedBrake, LoopBrake, LoopBrakeError
from distbrake.hooks import install
from tests.backends import memory_url


class Registry:
    """A host registry shaped like the Node plugin's host."""

    def __init__(self) -> None:
        self.tools: dict[str, Any] = {}

    def register(self, definition: dict[str, Any]) -> None:
        self.tools[definition["name"]] = definition

    def execute(self, name: str, args: Any, context: Any = None) -> Any:
        return self.tools[name]["execute"](args, context)


class AsyncRegistry(Registry):
    async def execute(self, name: str, args: Any, context: Any = None) -> Any:  # type: ignore[override]
        return await self.tools[name]["execute"](args, context)


def counting_tool(name: str, runs: list[str]) -> dict[str, Any]:
    def execute(args: Any, context: Any = None) -> str:
        runs.append(name)
        return f"{name} ran"

    return {"name": name, "execute": execute}


@pytest.mark.parametrize("make_brake", [LoopBrake, lambda: DistributedBrake.from_url(memory_url())])
def test_both_seams_count_a_call_once(make_brake: Any) -> None:
    runs: list[str] = []
    registry = Registry()
    registry.register(counting_tool("early", runs))  # registered before the brake
    handle = install(registry, make_brake())
    late = counting_tool("late", runs)
    registry.register(late)
    assert registry.tools["late"] is not late  # a braked copy; the caller's definition is untouched
    assert late["execute"]("x") == "late ran"  # the original runs unbraked
    for name in ("early", "late"):
        assert registry.execute(name, {"q": 1}, {"session_id": "s"}) == f"{name} ran"
        assert registry.execute(name, {"q": 1}, {"session_id": "s"}) == f"{name} ran"
        with pytest.raises(LoopBrakeError) as caught:
            registry.execute(name, {"q": 1}, {"session_id": "s"})
        assert caught.value.count == 3 and caught.value.tool_name == name
    # a braked copy called directly (not through registry.execute) is braked too
    braked = registry.tools["late"]["execute"]
    assert braked({"z": 1}, {"agent_id": "a"}) == "late ran"
    handle.dispose()


def test_call_id_makes_the_two_seams_one_call() -> None:
    runs: list[str] = []
    registry = Registry()
    brake = LoopBrake()
    install(registry, brake)
    registry.register(counting_tool("t", runs))
    # the same host call (same call id) arriving at each seam with a copy of its args
    context = {"session_id": "s", "call_id": "call-1"}
    registry.tools["t"]["execute"]({"a": 1}, context)
    registry.execute("t", {"a": 1}, context)
    assert brake.inspect("s") is not None and brake.inspect("s").count == 1  # type: ignore[union-attr]


def test_dispose_restores_the_registry_exactly_and_forgets_streaks() -> None:
    registry = Registry()
    original_register, original_execute = registry.register, registry.execute
    before = dict(vars(registry))
    brake = LoopBrake()
    handle = install(registry, brake)
    assert registry.register != original_register and registry.execute != original_execute
    registry.register(counting_tool("t", []))
    registry.execute("t", {}, {"session_id": "s"})
    assert brake.inspect("s") is not None
    handle.dispose()
    handle.dispose()  # idempotent
    assert set(vars(registry)) == set(before)  # no patched attribute left behind
    assert registry.register == original_register and registry.execute == original_execute
    assert type(registry).register is Registry.register
    assert brake.inspect("s") is None  # in-process streaks forgotten
    for _ in range(5):  # copies registered while installed now pass through
        assert registry.execute("t", {}, {"session_id": "s"}) == "t ran"


def test_instance_level_seams_are_restored_by_identity() -> None:
    class Host:
        pass

    def execute(name: str, args: Any, context: Any = None) -> str:
        return "ran"

    host = Host()
    host.execute = execute  # type: ignore[attr-defined]
    handle = install(host, LoopBrake())
    assert host.execute is not execute  # type: ignore[attr-defined]
    handle.dispose()
    assert host.execute is execute  # type: ignore[attr-defined]


def test_install_registers_no_tool_and_needs_a_seam() -> None:
    registry = Registry()
    with install(registry, LoopBrake()):
        assert registry.tools == {}
    with pytest.raises(TypeError):
        install(object(), LoopBrake())


async def test_async_registry() -> None:
    runs: list[str] = []
    registry = AsyncRegistry()
    brake = AsyncDistributedBrake.from_url(memory_url())

    async def execute(args: Any, context: Any = None) -> str:
        runs.append("t")
        return "ok"

    handle = install(registry, brake)
    registry.register({"name": "t", "execute": execute})
    assert await registry.execute("t", [1], {"session_id": "s"}) == "ok"
    assert await registry.execute("t", [1], {"session_id": "s"}) == "ok"
    with pytest.raises(LoopBrakeError):
        await registry.execute("t", [1], {"session_id": "s"})
    assert runs == ["t", "t"]
    handle.dispose()
    await brake.aclose()


def test_async_brake_on_a_second_loop() -> None:
    import asyncio

    brake = AsyncDistributedBrake.from_url(memory_url())
    assert asyncio.run(brake.check("t", 1)).count == 1  # first loop, then closed
    assert asyncio.run(brake.check("t", 1)).count == 2  # a new loop after the old one closed

    first, second = asyncio.new_event_loop(), asyncio.new_event_loop()
    try:
        assert first.run_until_complete(brake.check("t", 2)).count == 1
        with pytest.raises(RuntimeError, match="another event loop"):
            second.run_until_complete(brake.check("t", 2))
        assert first.run_until_complete(brake.check("t", 2)).count == 2
    finally:
        first.close()
        second.close()
