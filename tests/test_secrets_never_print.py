"""No password in any output: every CLI command (through ``main``, with ``--dsn`` and with
``$DATABASE_URL``) and every constructor that takes a DSN, given hostile DSNs (libpq
refuses some, the others reach no server), prints and raises nothing that holds it."""

from __future__ import annotations

import logging
import traceback
from urllib.parse import quote

import pytest

from langgraph_deterministic import DeterministicError, DeterministicSaver
from langgraph_deterministic._dsn import UNPARSEABLE, parse_error, redact, scrub
from langgraph_deterministic.cli import main
from langgraph_deterministic.embedded import (
    check_connection,
    create_database,
    ensure_database_url,
    redact_dsn,
)
from langgraph_deterministic.ops import _connect
from langgraph_deterministic.ops.audit import audit
from langgraph_deterministic.ops.repair import repair
from langgraph_deterministic.ops.uninstall import uninstall

S = "Zq9hunter2T0pSecret"
NOWHERE = "127.0.0.1:1"  # loopback, nothing listens: refused at once

HOSTILE = {
    # libpq refuses these, and its message quotes the token it choked on
    "unencoded_percent": f"postgresql://u:{S}%zz@{NOWHERE}/db",
    "space": f"postgresql://u:{S} x@{NOWHERE}/db",
    "open_bracket": f"postgresql://u:{S}@[::1:1/db",
    "query_percent": f"postgresql://u@{NOWHERE}/db?password={S}%zz",
    "hash_in_password": f"postgresql://u:{S}#?@{NOWHERE}/db",
    "kv_broken": f"host=127.0.0.1 port=1 password={S} broken",
    "kv_unterminated_quote": f"host=127.0.0.1 port=1 password='{S}",
    # these parse, and then reach no server
    "uri": f"postgresql://u:{quote(S + '%@:/')}@{NOWHERE}/db",
    "at_in_password": f"postgresql://u:{S}@{S}@{NOWHERE}/db",
    "kv_quoted": f"host=127.0.0.1 port=1 user=u password='{S} \\' x'",
    "sslpassword": f"postgresql://u:{S}@{NOWHERE}/db?sslpassword={S}",
    "bad_port": f"host=127.0.0.1 port=abc password={S}",
}

COMMANDS = [
    ["migrate"], ["migrate", "--dry-run"], ["status"], ["demo"], ["audit"], ["audit", "--json"],
    ["repair"], ["repair", "--apply", "--json"], ["uninstall", "--dry-run"],
]  # fmt: skip


def _nowhere_in(*texts: str) -> None:
    for text in texts:
        assert S not in text, text
        assert quote(S) not in text, text


@pytest.mark.parametrize("name", sorted(HOSTILE))
@pytest.mark.parametrize("via", ["--dsn", "$DATABASE_URL"])
def test_every_cli_command(
    name: str, via: str, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    caplog.set_level(logging.DEBUG)
    dsn = HOSTILE[name]
    for argv in COMMANDS:
        if via == "--dsn":
            monkeypatch.delenv("DATABASE_URL", raising=False)
            code = main([argv[0], "--dsn", dsn, *argv[1:]])
        else:
            monkeypatch.setenv("DATABASE_URL", dsn)
            code = main(argv)
        out, err = capfd.readouterr()
        assert code == 2, (argv, out, err)  # a usage/connection error, not "damage found"
        assert "error:" in err and ("Fix" in err or "fix" in err), err
        _nowhere_in(out, err, caplog.text)


def _raised(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc)) + repr(exc)


@pytest.mark.parametrize("name", sorted(HOSTILE))
async def test_every_constructor(name: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    dsn = HOSTILE[name]
    texts: list[str] = []

    def sync_saver() -> None:
        with DeterministicSaver(dsn) as saver:
            saver.setup()

    def from_conn_string() -> None:
        with DeterministicSaver.from_conn_string(dsn) as saver:
            saver.get_tuple({"configurable": {"thread_id": "t"}})

    for build in (
        sync_saver, from_conn_string, lambda: check_connection(dsn),
        lambda: create_database(dsn), lambda: _connect.check(dsn, "--dsn"),
        lambda: audit(dsn), lambda: repair(dsn), lambda: uninstall(dsn, dry_run=True),
    ):  # fmt: skip
        with pytest.raises(DeterministicError) as err:
            build()
        texts.append(_raised(err.value))
    with pytest.raises(DeterministicError) as err:
        async with DeterministicSaver(dsn) as saver:
            await saver.asetup()
    texts.append(_raised(err.value))
    texts += [redact(dsn), redact_dsn(dsn), scrub(f"x {dsn} y", dsn)]
    _nowhere_in(*texts, caplog.text)


def test_database_url_of_the_test_helpers(monkeypatch: pytest.MonkeyPatch) -> None:
    for dsn in HOSTILE.values():
        monkeypatch.setenv("DATABASE_URL", dsn)
        with pytest.raises(DeterministicError) as err:
            ensure_database_url()
        _nowhere_in(_raised(err.value))


def test_redaction_keeps_what_is_not_secret() -> None:
    assert redact(f"postgresql://app:{S}@db.internal:5433/prod") == (
        "user=app password=*** dbname=prod host=db.internal port=5433"
    )
    assert redact(HOSTILE["unencoded_percent"]) == UNPARSEABLE
    text = parse_error(ValueError(f'invalid percent-encoded token: "{S}%zz"'))
    assert text == 'invalid percent-encoded token: "…"'
