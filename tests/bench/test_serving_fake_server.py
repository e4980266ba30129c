"""run_benchmark end to end against a fake OpenAI-compatible streaming server on loopback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.serving import LATENCY_KEYS, RUN_FIELDS, STAT_FIELDS, BenchConfig, main, run_benchmark
from bench.workloads import WorkloadSpec
from tests.bench.fake_server import MODEL, FakeOptions, fake_server

REPORT_FIELDS = ("schema_version", "tool", "created_at", "base_url", "model", "workload", "config", "runs",
                 "plots")
SMALL = dict(vocab_size=5000, min_token_id=1000, seed=1)


def _check_complete(report: dict) -> None:
    assert set(REPORT_FIELDS) <= set(report)
    for run in report["runs"]:
        assert set(RUN_FIELDS) <= set(run), set(RUN_FIELDS) - set(run)
        for key in LATENCY_KEYS:
            assert set(STAT_FIELDS) <= set(run[key])
    json.dumps(report, allow_nan=False)  # strict JSON: no NaN / Infinity


def test_random_tokens_counted_equal_tokens_returned(tmp_path: Path) -> None:
    opts = FakeOptions()
    spec = WorkloadSpec(name="random", num_prompts=12, input_len=24, output_len=9, **SMALL)
    out_json = tmp_path / "out" / "serving.json"
    with fake_server(opts) as url:
        report = run_benchmark(BenchConfig(base_url=url, workload=spec, max_concurrency=4, disable_tqdm=True,
                                           output_json=str(out_json), plot_dir=str(tmp_path / "plots")))
    _check_complete(report)
    run = report["runs"][0]
    assert report["model"] == MODEL and run["max_concurrency"] == 4 and run["request_rate"] == "inf"
    assert run["completed"] == 12 and run["failed"] == 0
    assert run["token_counts_consistent"] and run["output_len_mismatches"] == 0
    assert run["total_output_tokens_stream"] == run["total_output_tokens_usage"] == 12 * 9
    assert run["total_input_tokens"] == 12 * 24 and run["prompt_len_mismatches"] == 0
    assert run["ttft_ms"]["count"] == 12 and run["itl_ms"]["count"] == 12 * 8
    assert 1 <= opts.max_in_flight <= 4
    assert sorted(len(p) for p in opts.prompts[1:]) == [24] * 12  # after the one warm-up request
    assert json.loads(out_json.read_text()) == json.loads(json.dumps(report))
    assert report["plots"] and all(Path(p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in report["plots"])


def test_multi_turn_resends_history_with_server_answers() -> None:
    opts = FakeOptions()
    spec = WorkloadSpec(name="multi-turn", num_clients=3, num_turns=3, input_len=40, turn_len=8,
                        output_len=10,
                        **SMALL)
    with fake_server(opts) as url:
        report = run_benchmark(BenchConfig(base_url=url, workload=spec, disable_tqdm=True))
    run = report["runs"][0]
    assert run["completed"] == 9 and run["answer_ids_source"] == "server"
    prompts = opts.prompts[1:]
    assert sorted(len(p) for p in prompts) == [40] * 3 + [58] * 3 + [76] * 3
    for p in prompts:
        if len(p) > 40:  # the earlier turn's prompt + that turn's answer is a prefix, as the server saw it
            assert any(seq == p[:len(seq)] for seq in opts.seen if len(seq) == len(p) - 8)
    assert run["cache_hit_rate"] > 0.4  # turns 2 and 3 hit the previous turns' pages


def test_count_mismatch_is_flagged_and_answers_are_synthesized() -> None:
    opts = FakeOptions(token_ids=False, two_tokens_per_chunk=True)
    spec = WorkloadSpec(name="multi-turn", num_clients=2, num_turns=2, input_len=20, turn_len=4, output_len=6,
                        **SMALL)
    with fake_server(opts) as url:
        run = run_benchmark(BenchConfig(base_url=url, workload=spec, disable_tqdm=True))["runs"][0]
    assert run["completed"] == 4
    assert not run["token_counts_consistent"] and run["token_count_mismatches"] == 4
    assert run["total_output_tokens_stream"] == 12 and run["total_output_tokens_usage"] == 24
    assert run["total_output_tokens"] == 24 and run["output_len_mismatches"] == 0
    assert run["answer_ids_source"] == "synthetic"
    assert sorted(len(p) for p in opts.prompts[1:]) == [20, 20, 30, 30]


def test_errors_are_counted_and_main_exits_nonzero(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    opts = FakeOptions(fail_prompt_len=17)
    with fake_server(opts) as url:
        argv = ["--base-url", url, "--workload", "long-short", "--num-prompts", "10", "--long-fraction",
                "0.3",
                "--input-len", "12", "--long-input-len", "17", "--output-len", "3", "--vocab-size", "5000",
                "--disable-tqdm", "--output-json", str(tmp_path / "r.json")]
        code = main(argv)
    report = json.loads((tmp_path / "r.json").read_text())
    run = report["runs"][0]
    assert code == 1
    assert run["failed"] == 3 and run["completed"] == 7
    assert "refused" in run["errors"][0] and "HTTP 400" in run["errors"][0]
    assert "error: HTTP 400" in capsys.readouterr().out


def test_concurrency_sweep_runs_each_level_on_fresh_prompts(tmp_path: Path) -> None:
    opts = FakeOptions(delay_s=0.001)
    spec = WorkloadSpec(name="random", num_prompts=8, input_len=16, output_len=4, **SMALL)
    with fake_server(opts) as url:
        report = run_benchmark(BenchConfig(base_url=url, workload=spec, concurrency_sweep=[1, 2, 8],
                                           request_rate=500.0, disable_tqdm=True, plot_dir=str(tmp_path)))
    _check_complete(report)
    assert [r["max_concurrency"] for r in report["runs"]] == [1, 2, 8]
    assert [r["workload_seed"] for r in report["runs"]] == [1, 2, 3]
    assert all(r["completed"] == 8 and r["cache_hit_rate"] == 0 for r in report["runs"])
    assert report["config"]["request_rate"] == 500.0
    assert sorted(Path(p).name for p in report["plots"]) == ["concurrency_random.png",
                                                             "latency_cdf_random.png"]


def test_main_succeeds_and_prints_a_table(capsys: pytest.CaptureFixture) -> None:
    with fake_server(FakeOptions()) as url:
        code = main(["--base-url", url, "--workload", "shared-prefix", "--num-groups", "2",
                     "--prompts-per-group", "3", "--system-prompt-len", "32", "--question-len", "4",
                     "--output-len", "3", "--vocab-size", "5000", "--max-concurrency", "1", "--disable-tqdm"])
    out = capsys.readouterr().out
    assert code == 0
    assert "workload shared-prefix: 6 requests" in out and "6/6 ok" in out and "WARNING" not in out


@pytest.mark.parametrize("fail", [None, 17])
def test_raw_and_httpx_transports_record_the_same_outcomes(fail: int | None) -> None:
    """The raw asyncio client (the default) and httpx see the same streams, counts and errors."""
    spec = WorkloadSpec(name="random", num_prompts=6, input_len=17, output_len=5, **SMALL)
    runs = {}
    for transport in ("raw", "httpx"):
        with fake_server(FakeOptions(fail_prompt_len=fail)) as url:
            runs[transport] = run_benchmark(BenchConfig(base_url=url, workload=spec, max_concurrency=3,
                                                        disable_tqdm=True, transport=transport))["runs"][0]
    keys = ("completed", "failed", "total_output_tokens_stream", "total_output_tokens_usage",
            "total_input_tokens")
    assert {k: runs["raw"][k] for k in keys} == {k: runs["httpx"][k] for k in keys}
    if fail is None:
        assert runs["raw"]["completed"] == 6 and runs["raw"]["total_output_tokens_stream"] == 30
    else:  # every prompt has the failing length: HTTP 400 with the server's body, never an exception
        assert runs["raw"]["failed"] == 6
        assert runs["raw"]["errors"] == runs["httpx"]["errors"] and "HTTP 400" in str(runs["raw"]["errors"])
    with pytest.raises(ValueError, match="transport"):
        BenchConfig(transport="curl")


def test_raw_transport_sends_the_key_and_path_prefix_and_reports_a_refused_connection() -> None:
    import asyncio

    from bench.serving import RequestOutcome, send_request

    seen: list[bytes] = []

    async def main() -> tuple[RequestOutcome, RequestOutcome]:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            head = await reader.readuntil(b"\r\n\r\n")
            seen.append(head)
            n = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            await reader.readexactly(n)
            ev = (b'data: {"choices":[{"index":0,"text":"a","token_ids":[7]}]}\n\n'
                  b'data: {"choices":[{"index":0,"text":"b","token_ids":[8],"finish_reason":"length"}],'
                  b'"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\ndata: [DONE]\n\n')
            # no content-length and no chunking: the body ends when the connection closes
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n" + ev)
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        cfg = BenchConfig(base_url=f"http://127.0.0.1:{port}/prefix", api_key="K", timeout_s=10)
        ok = await send_request(None, cfg, "m", RequestOutcome(0, 0, 3, 2), [1, 2, 3])  # type: ignore[arg-type]
        server.close()
        await server.wait_closed()
        refused = await send_request(None, cfg, "m", RequestOutcome(0, 1, 3, 2), [1, 2, 3])  # type: ignore[arg-type]
        return ok, refused

    ok, refused = asyncio.run(main())
    assert ok.ok and ok.stream_tokens == 2 and ok.usage_completion_tokens == 2 and ok.ttft_s is not None
    assert seen[0].startswith(b"POST /prefix/v1/completions HTTP/1.1\r\n")
    assert b"authorization: Bearer K\r\n" in seen[0]
    assert not refused.ok and "ConnectionRefusedError" in refused.error


@pytest.mark.parametrize("fail", [None, 17])
def test_keep_alive_reuses_the_connections_opened_before_the_clock(fail: int | None) -> None:
    """`connections="keep-alive"` (the default) opens one connection per request that can be in flight
    before the clock and sends every request over them; `close` opens one per request. Both record the
    same outcomes, an HTTP error included (its connection is reused too)."""
    spec = WorkloadSpec(name="multi-turn", num_clients=3, num_turns=3, input_len=17, turn_len=5, output_len=4,
                        **SMALL)
    runs, ports = {}, {}
    for mode in ("keep-alive", "close"):
        opts = FakeOptions(fail_prompt_len=fail)
        with fake_server(opts) as url:
            runs[mode] = run_benchmark(BenchConfig(base_url=url, workload=spec, disable_tqdm=True,
                                                   connections=mode))["runs"][0]
        ports[mode] = opts.client_ports
    keys = ("completed", "failed", "total_output_tokens_stream", "total_output_tokens_usage",
            "total_input_tokens", "errors")
    assert {k: runs["keep-alive"][k] for k in keys} == {k: runs["close"][k] for k in keys}
    n = len(ports["close"])
    assert n == (1 + 3 if fail == 17 else 1 + 9)  # the warm-up request, then 3 sessions x 3 turns (or 1)
    assert len(set(ports["close"])) == n
    # keep-alive: the warm-up request's connection back in the pool plus 2 opened before the clock,
    # each reused by every later request
    assert runs["keep-alive"]["connections"] == "keep-alive"
    assert runs["keep-alive"]["connections_opened"] == 3 == len(set(ports["keep-alive"]))
    assert len(ports["keep-alive"]) == n
    assert runs["close"]["connections"] == "close" and runs["close"]["connections_opened"] is None
    with pytest.raises(ValueError, match="connections"):
        BenchConfig(connections="pipelined")


def test_keep_alive_replaces_a_connection_the_server_closed() -> None:
    """A pooled connection that the server closed while idle is replaced by a fresh one, once, and
    the request succeeds; a response marked `connection: close` is not pooled."""
    import asyncio

    from bench.serving import ConnectionPool, RequestOutcome, send_request

    conns: list[int] = []

    async def main() -> tuple[list[RequestOutcome], int, int]:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            conns.append(writer.get_extra_info("peername")[1])
            if len(conns) == 1:  # the first connection: closed at once, before any request
                writer.close()
                return
            head = await reader.readuntil(b"\r\n\r\n")
            n = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            await reader.readexactly(n)
            ev = (b'data: {"choices":[{"index":0,"text":"a","token_ids":[7],"finish_reason":"length"}],'
                  b'"usage":{"prompt_tokens":3,"completion_tokens":1}}\n\ndata: [DONE]\n\n')
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n"
                         b"content-length: " + str(len(ev)).encode() + b"\r\n\r\n" + ev)
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        cfg = BenchConfig(base_url=f"http://127.0.0.1:{port}", timeout_s=10)
        pool = ConnectionPool(cfg.base_url)
        await pool.warm(1)
        await asyncio.sleep(0.05)  # the server has closed it by now
        outs = [await send_request(None, cfg, "m", RequestOutcome(0, i, 3, 1), [1, 2, 3], pool)  # type: ignore[arg-type]
                for i in range(2)]
        server.close()
        await server.wait_closed()
        return outs, pool.opened, len(pool.idle)

    outs, opened, idle = asyncio.run(main())
    assert all(o.ok and o.output_tokens == 1 for o in outs), [o.error for o in outs]
    # warm 1 (closed by the server), its replacement, then a new one for the second request: the first
    # response said `connection: close`, so nothing was pooled
    assert opened == 3 and idle == 0 and len(conns) == 3


@pytest.mark.parametrize("when", ["idle", "idle_crlf", "on_send", "on_send_close"])
def test_keep_alive_never_reads_stale_bytes_as_the_next_answer(when: str) -> None:
    """A server that times an idle keep-alive connection out with `408` and closes it: sent while the
    connection sits in the pool (`idle`) or in answer to the next request on it (`on_send`, the race);
    or that leaves a stray CRLF after a response (`idle_crlf`), or that closes the connection when the
    next request arrives on it, unanswered (`on_send_close`). The next request is answered on a
    fresh connection, never with those bytes."""
    import asyncio

    from bench.serving import ConnectionPool, RequestOutcome, send_request

    conns: list[int] = []
    timeout = b"HTTP/1.1 408 Request Timeout\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"

    async def main() -> list[RequestOutcome]:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            conns.append(writer.get_extra_info("peername")[1])
            first = len(conns) == 1
            for served in range(2):
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, OSError):
                    break
                await reader.readexactly(int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0]))
                if first and served == 1 and when.startswith("on_send"):
                    if when == "on_send":
                        writer.write(timeout)
                    break
                ev = (b'data: {"choices":[{"index":0,"text":"a","token_ids":[7],"finish_reason":"length"}],'
                      b'"usage":{"prompt_tokens":3,"completion_tokens":1}}\n\ndata: [DONE]\n\n')
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: "
                             + str(len(ev)).encode() + b"\r\n\r\n" + ev)
                await writer.drain()
                if first and when == "idle":
                    await asyncio.sleep(0.05)
                    writer.write(timeout)
                    await writer.drain()
                    await asyncio.sleep(0.5)  # closes only later: the bytes wait in the client's buffer
                    break
                if first and when == "idle_crlf":  # then serves the next request on this connection
                    writer.write(b"\r\n")
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        cfg = BenchConfig(base_url=f"http://127.0.0.1:{port}", timeout_s=10)
        pool = ConnectionPool(cfg.base_url)
        outs = []
        for i in range(2):
            outs.append(await send_request(None, cfg, "m", RequestOutcome(0, i, 3, 1), [1, 2, 3], pool))  # type: ignore[arg-type]
            await asyncio.sleep(0.2)
        pool.close()
        server.close()
        await server.wait_closed()
        return outs

    outs = asyncio.run(main())
    assert [o.error for o in outs] == [None, None] and all(o.output_tokens == 1 for o in outs)
    assert len(conns) == 2  # the second request went over a fresh connection


def test_pool_opened_ahead_only_when_the_in_flight_count_is_known() -> None:
    from bench.serving import POOL_MAX, _pool_max, _warm_count

    assert _warm_count(128, None, float("inf")) == 128  # a burst: every session at once
    assert _warm_count(128, 16, float("inf")) == 16 and _warm_count(8, 16, 2.0) == 8
    assert _warm_count(128, None, 5.0) == 0  # spread arrivals: the pool grows as they need it
    assert 1 <= _pool_max() <= POOL_MAX
