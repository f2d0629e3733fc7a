"""LangGraph's own test suite as an oracle for DeterministicSaver.

Downloads the sdists of the *installed* ``langgraph`` and ``langgraph-checkpoint-postgres``,
copies their ``tests/`` into ``.langgraph-suite/`` (or ``$LGD_SUITE_DIR``), and runs their Postgres tests
once per mode, sequentially, against one Postgres (``$DATABASE_URL`` or an embedded one):

``theirs``     their savers, as shipped: the baseline
``ours-off``   DeterministicSaver swapped in (``lgd_swap.py``), ``run_id_policy="off"``
``ours-warn``  the same with ``run_id_policy="warn"``
``ours-require`` ``run_id_policy="require"``, and every root graph call / ``update_state``
               of their tests given a new run id through ``run_config``, as a user under
               ``require`` would (their tests build plain configs)

The items run are, from langgraph, every test parametrized over one of the six Postgres
checkpointer fixtures of ``tests/conftest_checkpointer.py``, and from
langgraph-checkpoint-postgres its checkpointer tests (not the store's, not the shallow
saver's). Prints per-mode counts and writes ``report.md`` (counts, and every test that
passes on theirs and not on ours, grouped by the first line of its error) and
``results-<mode>-<suite>.json`` to the output directory.

    python benchmarks/langgraph_suite/run.py [--modes theirs,ours-off,ours-warn] [-k EXPR]

Not part of the default test run: a mode takes about 10 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from collections import Counter, defaultdict
from importlib import metadata
from pathlib import Path
from urllib.parse import quote

from psycopg.conninfo import conninfo_to_dict

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
# Per checkout (not the shared .cache): the venv there is an editable install of this tree.
WORK = Path(os.environ.get("LGD_SUITE_DIR") or ROOT / ".langgraph-suite")
SUITES = {
    "langgraph": "langgraph",
    "checkpoint-postgres": "langgraph-checkpoint-postgres",
}
MODES = {
    "theirs": {"LGD_SUITE_SAVER": "theirs"},
    "ours-off": {"LGD_SUITE_SAVER": "ours", "LGD_SUITE_POLICY": "off"},
    "ours-warn": {"LGD_SUITE_SAVER": "ours", "LGD_SUITE_POLICY": "warn"},
    "ours-require": {
        "LGD_SUITE_SAVER": "ours",
        "LGD_SUITE_POLICY": "require",
        "LGD_SUITE_RUN_IDS": "1",
    },
}
# pytest.ini of the copied tests: their pyproject's test settings, minus coverage and
# output flags (syrupy must not fail the session on snapshots of deselected tests).
ONLY = ""  # --only
INI = {
    "langgraph": "[pytest]\naddopts = --snapshot-warn-unused -p no:asyncio\n",
    "checkpoint-postgres": "[pytest]\nasyncio_mode = auto\n",
}


def sdist_tests(dist: str, work: Path) -> Path:
    """``tests/`` of the installed version's sdist, copied alone into a fresh root (the
    sdist's own ``langgraph/`` sources must not shadow the installed package)."""
    version = metadata.version(dist)
    root = work / f"{dist}-{version}"
    if (root / "tests").is_dir():
        return root
    downloads = work / "sdist"
    downloads.mkdir(parents=True, exist_ok=True)
    norm = dist.replace("-", "_")
    found = [
        p
        for p in downloads.glob("*.tar.gz")
        if p.name.lower().startswith((f"{dist}-{version}.", f"{norm}-{version}."))
    ]
    if not found:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
             "--no-binary", ":all:", f"{dist}=={version}", "-d", str(downloads)],
            check=True,
        )  # fmt: skip
        found = [
            p
            for p in downloads.glob("*.tar.gz")
            if p.name.lower().startswith((f"{dist}-{version}.", f"{norm}-{version}."))
        ]
    (archive,) = found
    unpacked = work / "unpacked"
    with tarfile.open(archive) as tar:
        tar.extractall(unpacked, filter="data")
    (top,) = [p for p in unpacked.iterdir() if p.name.lower().startswith((dist, norm)) and
              p.name.endswith(version)]  # fmt: skip
    root.mkdir(parents=True, exist_ok=True)
    shutil.copytree(top / "tests", root / "tests")
    return root


def base_uri(dsn: str) -> str:
    """``postgresql://user[:pw]@host:port/``: their fixtures append a database name."""
    info = conninfo_to_dict(dsn)
    user = quote(str(info.get("user") or "postgres"), safe="")
    password = info.get("password")
    auth = user + (":" + quote(str(password), safe="") if password else "")
    host = quote(str(info.get("host") or "localhost"), safe="")
    port = info.get("port") or "5432"
    return f"postgresql://{auth}@{host}:{port}/"


def run_one(
    suite: str, root: Path, mode: str, base: str, admin: str, out: Path, extra: list[str]
) -> dict[str, dict[str, str]]:
    from devtools.postgres import create_database, database_name, drop_database

    (root / "pytest.ini").write_text(INI[suite])
    scratch = database_name(create_database(admin, prefix="lgd_suite"))
    results = out / f"results-{mode}-{suite}.json"
    results.unlink(missing_ok=True)
    env = {
        **os.environ,
        **MODES[mode],
        "LGD_SUITE_KIND": suite,
        "LGD_SUITE_BASE_URI": base,
        "LGD_SUITE_DB": scratch,
        "LGD_SUITE_RESULTS": str(results),
        "PYTHONPATH": os.pathsep.join([str(HERE), str(root)]),
        "NO_DOCKER": "false",
        "LGD_SUITE_ONLY": ONLY,
    }
    cmd = [sys.executable, "-m", "pytest", "-p", "lgd_swap", "-q", "-rfE", "-p", "no:cacheprovider",
           "--continue-on-collection-errors", "--rootdir", str(root), "-c",
           str(root / "pytest.ini"), "tests", *extra]  # fmt: skip
    started = time.monotonic()
    log = out / f"pytest-{mode}-{suite}.log"
    try:
        with log.open("w") as fh:
            subprocess.run(cmd, cwd=root, env=env, stdout=fh, stderr=subprocess.STDOUT)
    finally:
        drop_database(admin, scratch)
    print(f"  {mode:9} {suite:19} {time.monotonic() - started:6.0f} s  (log: {log})")
    if not results.exists():
        raise SystemExit(f"pytest wrote no results; see {log}")
    data: dict[str, dict[str, str]] = json.loads(results.read_text())
    return data


def cause(message: str) -> str:
    """A failure's group: its first line, with ids, addresses and numbers blurred."""
    line = message.strip().splitlines()[0] if message.strip() else "(no message)"
    line = re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}[0-9a-f.-]*", "<uuid>", line)
    line = re.sub(r"(thread|namespace) '[^']*'", r"\1 '…'", line)
    line = re.sub(r"0x[0-9a-f]+", "<addr>", line)
    line = re.sub(r"test_[0-9a-f]{16}", "<db>", line)
    line = re.sub(r"suite-[0-9a-f]{16}", "<run>", line)  # ours-require's run ids
    return line[:160]


def report(all_results: dict[str, dict[str, dict[str, str]]], out: Path) -> str:
    lines = ["# LangGraph's own tests: their saver vs DeterministicSaver", ""]
    versions = ", ".join(f"{d} {metadata.version(d)}" for d in SUITES.values())
    lines += [f"Versions: {versions}.", ""]
    lines += ["| mode | items | passed | failed | errors | skipped | xfailed |",
              "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for mode, res in all_results.items():
        c = Counter(r["outcome"] for r in res.values())
        lines.append(
            f"| {mode} | {len(res)} | {c['passed']} | {c['failed']} | {c['error']} "
            f"| {c['skipped']} | {c['xfailed']} |"
        )
    base = all_results.get("theirs")
    for mode, res in all_results.items():
        if mode == "theirs" or base is None:
            continue
        regressions = {
            nid: res.get(nid, {"outcome": "missing", "message": ""})
            for nid, r in base.items()
            if r["outcome"] == "passed" and res.get(nid, {}).get("outcome") != "passed"
        }
        passing = sum(1 for r in base.values() if r["outcome"] == "passed")
        lines += ["", f"## {mode}: {passing - len(regressions)} of the {passing} tests "
                  f"that pass on theirs pass on ours ({len(regressions)} do not)", ""]  # fmt: skip
        groups: dict[str, list[str]] = defaultdict(list)
        for nid, r in regressions.items():
            groups[cause(r["message"])].append(nid)
        for group, nids in sorted(groups.items(), key=lambda g: -len(g[1])):
            lines.append(f"### {len(nids)} x {group}")
            lines += [f"- `{n}`" for n in sorted(nids)]
            lines.append("")
    text = "\n".join(lines) + "\n"
    (out / "report.md").write_text(text)
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="theirs,ours-off,ours-warn")
    parser.add_argument("--suites", default=",".join(SUITES))
    parser.add_argument("--out", default=str(WORK / "out"))
    parser.add_argument(
        "--reuse",
        default="",
        help="modes whose results-*.json in --out are read instead of run (e.g. theirs)",
    )
    parser.add_argument(
        "--only", default="", help="keep only these of the six Postgres fixtures (comma list)"
    )
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments, after --")
    args = parser.parse_args()
    global ONLY
    ONLY = args.only
    modes = [m for m in args.modes.split(",") if m]
    suites = [s for s in args.suites.split(",") if s]
    for m in modes:
        if m not in MODES:
            parser.error(f"unknown mode {m!r}; choose from {', '.join(MODES)}")
    work = WORK
    out = Path(args.out).resolve()  # pytest runs in their tests' root
    out.mkdir(parents=True, exist_ok=True)
    roots = {s: sdist_tests(SUITES[s], work) for s in suites}

    from devtools.postgres import ensure_database_url

    admin, server = ensure_database_url()
    try:
        base = base_uri(admin)
        all_results: dict[str, dict[str, dict[str, str]]] = {}
        for mode in modes:
            merged: dict[str, dict[str, str]] = {}
            for suite in suites:
                saved = out / f"results-{mode}-{suite}.json"
                if mode in args.reuse.split(",") and saved.exists():
                    res = json.loads(saved.read_text())
                    print(f"  {mode:9} {suite:19} reused {saved}")
                else:
                    res = run_one(suite, roots[suite], mode, base, admin, out, args.pytest_args)
                merged.update({f"{suite}::{k}": v for k, v in res.items()})
            all_results[mode] = merged
            c = Counter(r["outcome"] for r in merged.values())
            print(
                f"{mode}: {len(merged)} items, "
                + ", ".join(f"{v} {k}" for k, v in sorted(c.items()))
            )
        text = report(all_results, out)
    finally:
        if server is not None:
            server.stop()
    summary = [ln for ln in text.splitlines() if ln.startswith(("|", "## "))]
    print("\n".join(summary))
    print(f"report: {out / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
