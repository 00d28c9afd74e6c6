"""The benchmarks' command lines: ``--host`` and ``-n`` as the original llama-router's tools spell them,
``--instance-url`` for a side-by-side run against one llama-server, and the flags that were there before."""

from __future__ import annotations

import argparse
import json
from typing import Any

import httpx
import pytest

from benchmarks import bench_concurrency, bench_overhead, bench_prompt_cache, bench_throughput
from benchmarks.results import host_url

PARSERS = {
    "concurrency": bench_concurrency.make_parser,
    "overhead": bench_overhead.make_parser,
    "prompt-cache": bench_prompt_cache.make_parser,
    "throughput": bench_throughput.make_parser,
}


def test_host_is_a_url_without_its_scheme() -> None:
    assert host_url("localhost:11434") == "http://localhost:11434"
    assert host_url("10.0.0.2:8080/") == "http://10.0.0.2:8080"
    assert host_url("https://router.lan") == "https://router.lan"
    with pytest.raises(argparse.ArgumentTypeError):
        host_url(" ")


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_every_benchmark_takes_host_or_url_but_not_both(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = PARSERS[name]()
    assert parser.parse_args(["--host", "localhost:11434"]).url == "http://localhost:11434"
    assert parser.parse_args(["--url", "http://127.0.0.1:8080"]).url == "http://127.0.0.1:8080"
    assert parser.parse_args([]).url is None
    with pytest.raises(SystemExit):
        parser.parse_args(["--host", "a:1", "--url", "http://b:2"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_n_is_the_count_each_benchmark_runs() -> None:
    assert bench_concurrency.make_parser().parse_args(["-n", "7"]).requests == 7
    assert bench_concurrency.make_parser().parse_args(["--requests", "9"]).requests == 9
    assert bench_concurrency.make_parser().parse_args([]).requests == 100
    assert bench_prompt_cache.make_parser().parse_args(["-n", "4"]).rounds == 4
    assert bench_overhead.make_parser().parse_args(["-n", "50"]).small == 50
    args = bench_concurrency.make_parser().parse_args(["--host", "localhost:11434", "-n", "100"])
    assert (args.url, args.requests) == ("http://localhost:11434", 100)


def test_instance_url_names_the_llama_server_compared_with() -> None:
    overhead = bench_overhead.make_parser()
    assert (
        overhead.parse_args(["--instance-url", "http://127.0.0.1:9000"]).direct_url == "http://127.0.0.1:9000"
    )
    assert (
        overhead.parse_args(["--direct-url", "http://127.0.0.1:9001"]).direct_url == "http://127.0.0.1:9001"
    )
    cache = bench_prompt_cache.make_parser()
    assert (
        cache.parse_args(["--instance-url", "http://127.0.0.1:9000"]).instance_url == "http://127.0.0.1:9000"
    )
    assert cache.parse_args([]).instance_url is None


def fake_server(name: str, served: list[tuple[str, str]]) -> httpx.AsyncClient:
    """A stand-in for a router or a llama-server: every chat request reports 3 cached and 5 new tokens."""

    def answer(request: httpx.Request) -> httpx.Response:
        served.append((name, request.url.path))
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "alpha", "gpus": [0]}]})
        body = json.loads(request.content)
        reply: dict[str, Any] = {
            "choices": [{"message": {"content": f"from {name}"}}],
            "timings": {"cache_n": 3, "prompt_n": 5, "prompt_ms": 1.0},
            "model": body["model"],
        }
        return httpx.Response(200, json=reply)

    return httpx.AsyncClient(base_url=f"http://{name}", transport=httpx.MockTransport(answer))


async def test_prompt_cache_runs_the_same_rounds_against_the_instance(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    served: list[tuple[str, str]] = []
    monkeypatch.setattr(
        bench_prompt_cache, "async_client", lambda url: fake_server(url.split("//")[1], served)
    )
    argv = ["--host", "router:1", "--instance-url", "http://server:2", "-n", "2", "--prompt-words", "5"]
    args = bench_prompt_cache.make_parser().parse_args([*argv, "--held", "0"])
    result = await bench_prompt_cache.benchmark(args.url, args)
    instance = result["instance"]
    assert instance["url"] == "http://server:2"
    steps = ["first", "repeat", "next turn", "cache_prompt off"]
    assert [s["step"] for s in result["steps"]] == steps  # one model listed: no swap partner
    assert [s["step"] for s in instance["steps"]] == steps
    assert all(s["ok"] == 2 and s["reuse"] == 3 / 8 for s in instance["steps"])
    assert (
        sum(1 for name, path in served if name == "server:2" and path == "/v1/chat/completions") == 1 + 2 * 4
    )
    assert not any(name == "server:2" and path == "/v1/models" for name, path in served)
    bench_prompt_cache.report(result)


async def test_prompt_cache_without_an_instance_runs_the_router_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    served: list[tuple[str, str]] = []
    monkeypatch.setattr(
        bench_prompt_cache, "async_client", lambda url: fake_server(url.split("//")[1], served)
    )
    args = bench_prompt_cache.make_parser().parse_args(["--url", "http://router:1", "-n", "1", "--held", "0"])
    result = await bench_prompt_cache.benchmark(args.url, args)
    assert "instance" not in result and {name for name, _ in served} == {"router:1"}
