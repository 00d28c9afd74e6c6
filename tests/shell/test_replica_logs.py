"""Replica output in per-replica log files: rotation, pruning, /status and /logs/{replica}, and the router's
own log keeping replica lines at DEBUG."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from router.shell.replica_logs import ReplicaLogs, file_stem
from tests.support.client import assert_openai_error, post_chat
from tests.support.harness import running_router

# --------------------------------------------------------------------------------------------- the files


def test_a_replica_appends_after_a_marked_line_and_reads_back_only_its_own_part(tmp_path: Path) -> None:
    logs = ReplicaLogs(tmp_path / "logs", keep=5, max_bytes=1 << 20)
    first = logs.open("qwen", 1, "replica 1 of qwen: llama-server -m q.gguf")
    assert first is not None and first.path == tmp_path / "logs" / "qwen-1.log"
    first.write("old run line")
    logs.closed(first)
    again = logs.open("qwen", 1, "replica 1 of qwen: llama-server -m q.gguf")  # the next router run
    assert again is not None
    again.write("new run line")
    text = again.path.read_text()
    assert "old run line" in text and "new run line" in text
    assert text.splitlines()[0].startswith("--- ") and "replica 1 of qwen" in text.splitlines()[0]
    tail = again.read_tail(1 << 20)
    assert tail is not None and "new run line" in tail and "old run line" not in tail
    assert tail.startswith("--- ")


def test_a_file_past_its_size_is_renamed_and_started_afresh(tmp_path: Path) -> None:
    logs = ReplicaLogs(tmp_path, keep=5, max_bytes=200)
    file = logs.open("m", 2, "replica 2 of m")
    assert file is not None
    for i in range(30):
        file.write(f"line {i:02d} " + "x" * 20)
    assert file.path.stat().st_size <= 200
    backup = tmp_path / "m-2.log.1"
    assert backup.is_file() and backup.stat().st_size <= 200
    current = file.path.read_text()
    assert "line 29" in current and "continued from m-2.log.1" in current
    tail = file.read_tail(1 << 20)
    assert tail is not None and tail.endswith("line 29 " + "x" * 20 + "\n")


def test_only_the_newest_files_of_a_model_are_kept_and_running_ones_never_go(tmp_path: Path) -> None:
    logs = ReplicaLogs(tmp_path, keep=2, max_bytes=1 << 20)
    other = logs.open("m-1", 9, "another model whose name extends m")  # never pruned for "m"
    assert other is not None
    running = logs.open("m", 1, "replica 1")  # stays open: never removed
    assert running is not None
    for replica in range(2, 6):
        file = logs.open("m", replica, f"replica {replica}")
        assert file is not None
        os.utime(file.path, (1000.0 + replica, 1000.0 + replica))
        logs.closed(file)
        if replica == 2:
            (tmp_path / "m-2.log.1").write_text("rotated part of replica 2\n")
    # Newest first: m-1 (running, written just now), then 5, 4, 3, 2 (old times set above).
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m-1-9.log", "m-1.log", "m-5.log"]
    logs.closed(running)
    os.utime(running.path, (1000.0, 1000.0))
    file = logs.open("m", 6, "replica 6")
    assert file is not None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m-1-9.log", "m-5.log", "m-6.log"]


def test_an_unwritable_directory_costs_a_warning_not_a_replica(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    logs = ReplicaLogs(blocker / "logs", keep=2, max_bytes=1 << 20)
    with caplog.at_level(logging.WARNING, logger="router"):
        assert logs.open("m", 1, "replica 1") is None
        assert logs.open("m", 2, "replica 2") is None
    warnings = [r.getMessage() for r in caplog.records if "cannot write replica logs" in r.getMessage()]
    assert len(warnings) == 1 and "replica_logs" in warnings[0]


def test_file_names_keep_only_safe_characters() -> None:
    assert file_stem("Qwen2.5-7B_q4+x") == "Qwen2.5-7B_q4+x"
    assert file_stem("org/model:latest") == "org_model_latest"
    assert file_stem("..") == "model"


# ---------------------------------------------------------------------------------- through the router


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def router_log() -> Iterator[_Records]:
    handler = _Records()
    logger = logging.getLogger("router")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


async def test_replica_output_goes_to_its_file_and_to_debug_only(
    tmp_path: Path, router_log: _Records
) -> None:
    async with running_router(tmp_path, {"alpha": {}}) as h:
        assert (await post_chat(h.client, "alpha")).status_code == 200
        [replica] = (await h.status())["replicas"]
        path = Path(replica["log_path"])
        assert path.parent == tmp_path / "replica-logs" and path.name == f"alpha-{replica['id']}.log"
        assert replica["log_url"] == f"/logs/{replica['id']}"
        text = path.read_text()
        assert "load_tensors:" in text and f"started pid {replica['pid']}" in text

        served = await h.client.get(replica["log_url"])
        assert served.status_code == 200 and served.headers["content-type"].startswith("text/plain")
        assert served.headers["x-log-source"] == "file"
        assert "load_tensors:" in served.text and served.text.startswith("--- ")
        last = await h.client.get(replica["log_url"], params={"lines": 1})
        assert last.text == served.text.splitlines(keepends=True)[-1]
        assert_openai_error(await h.client.get("/logs/999"), 404, "replica_not_found")

    replica_lines = [r for r in router_log.records if "load_tensors:" in r.getMessage()]
    assert replica_lines and all(r.levelno == logging.DEBUG for r in replica_lines)
    info = [r.getMessage() for r in router_log.records if r.levelno >= logging.INFO]
    assert any(m.startswith("load alpha") for m in info) and any("ready after" in m for m in info)
    # The exit is recorded at the end of the file.
    assert "exited (" in path.read_text().splitlines()[-1]


async def test_logs_fall_back_to_memory_and_need_the_key(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    router = {"api_keys": ["sk-test"], "replica_logs": str(blocker / "logs")}
    async with running_router(tmp_path, {"alpha": {}}, router=router) as h:
        key = {"Authorization": "Bearer sk-test"}
        reply = await h.client.post(
            "/v1/chat/completions",
            json={"model": "alpha", "messages": [{"role": "user", "content": "hi"}]},
            headers=key,
        )
        assert reply.status_code == 200
        [replica] = (await h.client.get("/status", headers=key)).json()["replicas"]
        assert replica["log_path"] is None
        assert_openai_error(await h.client.get(replica["log_url"]), 401)
        served = await h.client.get(replica["log_url"], headers=key)
        assert served.status_code == 200 and served.headers["x-log-source"] == "memory"
        assert "load_tensors:" in served.text
