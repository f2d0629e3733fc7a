"""The service of docs/how-to/restate.md, as written, served by hypercorn and called through
a real restate-server under forced replay (every durable step suspends the invocation
and replays it): the parallel graph returns every branch's note, and the threaded
handler keeps the thread in Postgres across invocations."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from langgraph_deterministic import DeterministicSaver

from .restate_server import ServiceProcess, http, restate_server

pytestmark = pytest.mark.restate

DOC = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "restate.md"


def test_the_howto_service_runs_on_restate(restate_binary: Path, dsn: str, tmp_path: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text("utf-8"), re.S)
    assert len(blocks) == 2
    code = "\n".join(blocks).replace('"postgresql://..."', repr(dsn))
    code += "\napp = restate.app(services=[svc, chat])\n"  # both handlers in one deployment
    (tmp_path / "howto_service.py").write_text(code)

    server = restate_server(restate_binary, forced_replay=True)
    service = ServiceProcess(app="howto_service:app", cwd=tmp_path)
    server.start()
    try:
        service.start()
        server.register(service.uri)
        status, out = http("POST", f"{server.ingress}/Research/run",
                           {"topics": ["tides", "moons"]}, timeout=120)  # fmt: skip
        assert status == 200, (out, service.log_text()[-3000:])
        assert out == {"notes": ["facts about moons", "facts about tides"]}

        body = {"thread_id": "howto-1", "turn_id": "turn-1", "topics": ["orbits"]}
        status, out = http("POST", f"{server.ingress}/Chat/turn", body, timeout=120)
        assert status == 200, (out, service.log_text()[-3000:])
        assert out == {"notes": ["facts about orbits"], "interrupts": []}
        body = {"thread_id": "howto-1", "turn_id": "turn-2", "topics": ["tides"]}
        status, out = http("POST", f"{server.ingress}/Chat/turn", body, timeout=120)
        assert status == 200, (out, service.log_text()[-3000:])
        assert sorted(out["notes"]) == ["facts about orbits", "facts about tides"]
    finally:
        service.stop()
        server.stop()
    with DeterministicSaver(dsn) as saver:
        for turn in ("turn-1", "turn-2"):
            run = saver.get_run("howto-1", turn)
            assert run is not None and run.attempts == 1, (turn, run)
