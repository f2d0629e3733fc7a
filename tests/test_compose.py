"""docker-compose.yml, checked statically (no Docker here): the services exist, and the
ports, the worker's bind address and the registration URL agree with the example."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    assert isinstance(data, dict)
    return data


def published(service: dict[str, Any]) -> dict[int, str]:
    """container port -> host address, for every published port."""
    out = {}
    for spec in service.get("ports", []):
        host, _, rest = str(spec).rpartition(":")
        address, _, _host_port = host.rpartition(":")
        out[int(rest)] = address
    return out


def test_services_and_images(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {"postgres", "restate", "worker", "register"}
    assert services["postgres"]["image"] == "postgres:16"
    assert "restate" in services["restate"]["image"]
    assert services["register"]["restart"] == "no"  # a one-shot service
    # everything published is on loopback only
    for name, service in services.items():
        assert set(published(service).values()) <= {"127.0.0.1"}, name
    assert set(published(services["restate"])) == {8080, 9070}
    assert set(published(services["postgres"])) == {5432}


def test_worker_runs_the_example_where_restate_can_reach_it(
    compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("restate")
    from examples import restate_parallel_research as example

    worker = compose["services"]["worker"]
    env = worker["environment"]
    assert env[example.HOST_ENV] == "0.0.0.0"
    port = int(env[example.PORT_ENV])
    assert str(port) in [str(p) for p in worker["expose"]]
    dockerfile = worker["build"]["dockerfile_inline"]
    script = re.search(r'CMD \["python", "([^"]+)"\]', dockerfile)
    assert script and (REPO / script.group(1)).resolve() == Path(example.__file__).resolve()
    assert "COPY examples" in dockerfile and "[restate]" in dockerfile
    # the example binds as the compose file says, and to loopback by default
    monkeypatch.setenv(example.HOST_ENV, env[example.HOST_ENV])
    monkeypatch.setenv(example.PORT_ENV, env[example.PORT_ENV])
    assert example.bind_address() == f"0.0.0.0:{port}"
    monkeypatch.delenv(example.HOST_ENV)
    monkeypatch.delenv(example.PORT_ENV)
    assert example.bind_address() == f"127.0.0.1:{example.DEFAULT_PORT}"

    # the one-shot registration posts the worker's in-network address to the admin API
    register = " ".join(compose["services"]["register"]["command"])
    assert f'"uri": "http://worker:{port}"' in register
    admin = re.search(r"http://restate:(\d+)/deployments", register)
    assert admin and int(admin.group(1)) in published(compose["services"]["restate"])
    assert set(compose["services"]["register"]["depends_on"]) == {"restate", "worker"}
