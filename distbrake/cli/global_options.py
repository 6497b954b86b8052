"""The global options of one run (`App`): the effective settings and the brake they open."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..redis_brake import DistributedBrake
from ..settings import BrakeSettings
from ..urls import redact_url
from .run_state import current_run


@dataclass
class App:
    """What the global options asked for."""

    url: str | None
    timeout: float | None
    key_prefix: str | None
    max_repeats: int | None

    def given(self) -> dict[str, Any]:
        """The settings given on the command line (the "argument" source)."""
        return {
            "url": self.url, "timeout_seconds": self.timeout, "key_prefix": self.key_prefix,
            "max_repeats": self.max_repeats,
        }

    def settings(self, **extra: Any) -> BrakeSettings:
        """The effective settings: these options > DISTBRAKE_* variables > defaults."""
        options = {k: v for k, v in self.given().items() if k != "url"}
        return DistributedBrake.settings_for_url(self.url, None, **options, **extra)

    def brake(self, **extra: Any) -> DistributedBrake:
        settings = self.settings(**extra)
        current_run.backend = redact_url(settings.url or "memory://")
        current_run.timeout = settings.timeout_seconds
        return DistributedBrake.from_url(settings=settings)

    @contextlib.contextmanager
    def open(self, **extra: Any) -> Iterator[DistributedBrake]:
        brake = self.brake(**extra)
        try:
            yield brake
        finally:
            with contextlib.suppress(Exception):
                brake.close()
