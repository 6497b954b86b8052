"""docker-compose.yml parses and names what the README documents."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def test_compose_file_matches_the_readme() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    services = compose["services"]
    assert set(services) == {"redis", "redis-node-1", "redis-node-2", "redis-node-3", "cluster-init", "demo"}
    assert "--appendonly" in services["redis"]["command"] and "yes" in services["redis"]["command"]
    assert services["redis"]["ports"] == ["6379:6379"]
    for index, port in enumerate((7001, 7002, 7003), start=1):
        node = services[f"redis-node-{index}"]
        assert node["image"].startswith("redis:7")
        assert node["ports"] == [f"{port}:{port}"]
        assert str(port) in node["command"] and "--cluster-enabled" in node["command"]
    assert "--cluster create" in services["cluster-init"]["command"][-1]
    demo = " ".join(services["demo"]["command"])
    assert "distbrake --url redis://redis:6379/0 demo" in demo
    assert "redis+cluster://redis-node-1:7001" in demo
    # the README documents the command, the services and the ports
    assert "docker compose up demo" in readme
    for name in ("redis-node-1", "6379", "7001"):
        assert name in readme
