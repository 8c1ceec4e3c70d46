"""The rollout stage over real HTTP: how close it gets to the latency bound, and what it costs.

    python bench/rollout_http.py                       # 32 and 512 datapoints, 200 ms per request
    python bench/rollout_http.py --sizes 32 --latency 0.1 --repeats 3
    python bench/rollout_http.py --via cli             # the whole command, model_provider OpenAI

Starts a loopback OpenAI-compatible server in its own process that answers every chat request
after a fixed latency with `n` game-shaped choices (the dummy player's replies, no invalid ones).
NIP protocol, 3 rounds, K = 2: the latency bound is 3 x latency.

`--via stage` (default) runs the pipeline's own rollout stage in this process against it, as a
`SelfHosted` agent: the chat clients, the call journal, shard checkpoints and the manifest,
exactly as `generate-rollouts` does (Prefect's task wrapper left out). Prints per size:
wall / (rounds x latency), model calls per second and the client's CPU milliseconds per model
call (this process, all threads). Targets: <= 1.5 at 32 datapoints, >= 300 calls/s at 512,
<= 2 ms CPU per call.

`--via cli` runs `python -m flows.malt_iteration` as a child process with
`model_provider: OpenAI` and `OPENAI_BASE_URL` pointing at the loopback server (every agent
frozen, so nothing is fine-tuned; `frozen_agents_generate_one_response=false`, so K = 2 still
applies and the trees are those of `--via stage`), and reads the rollout stage's wall seconds
from the iteration's manifest. Prints per size: that wall / (rounds x latency) and model calls
per second. Targets: <= 1.5 at 32 datapoints, >= 400 calls/s at 512.

The last line is the ratio at the smallest size.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
ROUNDS, K = 3, 2


# ------------------------------------------------------------------ the loopback server


def serve(port: int, latency: float) -> None:
    """A minimal OpenAI-compatible chat server: sleep `latency`, answer `n` choices."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from nip_core.model_api.dummy_player import dummy_reply

    calls = 0
    arrivals: list[float] = []  # wall-clock time of every request, for the level breakdown

    async def chat(request: Request) -> JSONResponse:
        nonlocal calls
        arrivals.append(time.time())
        body = await request.json()
        await asyncio.sleep(latency)
        calls += 1
        texts = [
            dummy_reply(
                body["messages"],
                seed=0,
                request_seed=body.get("seed"),
                index=i,
                invalid_probability=0.0,
            )
            for i in range(body.get("n", 1))
        ]
        choices = [
            {"index": i, "message": {"role": "assistant", "content": t}, "finish_reason": "stop"}
            for i, t in enumerate(texts)
        ]
        return JSONResponse(
            {
                "id": f"bench-{calls}",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": choices,
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )

    async def stats(_: Request) -> JSONResponse:
        return JSONResponse({"calls": calls, "arrivals": arrivals})

    async def models(_: Request) -> JSONResponse:  # the flows' provider check asks first
        return JSONResponse({"object": "list", "data": [{"id": "gpt-4o-mini", "object": "model"}]})

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/stats", stats),
            Route("/v1/models", models),
        ]
    )
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", backlog=4096)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def loopback_server(latency: float, port: int | None = None) -> Iterator[str]:
    port = port or free_port()
    command = [sys.executable, __file__, "--serve", str(port), "--latency", str(latency)]
    process = subprocess.Popen(command, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/stats", timeout=1).status_code == 200:
                    break
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError("the loopback server did not start")
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(10)


# ------------------------------------------------------------------ the client side


def rollout_stage(url: str, root: str, run_name: str, datapoints: int) -> int:
    """Run the batch and rollout stages of one iteration against `url`; returns the nodes."""
    from nip_core.malt.batch_stage import write_batch
    from nip_core.parameters import HyperParameters, apply_overrides
    from nip_core.play.rollout_stage import grow_all_trees
    from nip_core.run.iteration_context import build_context
    from nip_core.run.run_folder import prepare_run
    from nip_core.run.stages import finished_stage

    port = url.rsplit(":", 1)[1]
    hp = apply_overrides(
        HyperParameters.construct_test_params(),
        [
            "agents._default.model_provider=SelfHosted",
            "agents._default.use_dummy_api=false",
            "agents._default.language_model_server_scheme_host=http://127.0.0.1",
            f"agents._default.language_model_server_port={port}",
            "interaction_protocol=nip",
            f"nip_protocol.max_message_rounds={ROUNDS}",
            f"pure_text_malt.num_responses_per_timestep={K}",
            f"rl.rollouts_per_iteration={datapoints}",
            "text_rl.max_concurrent_requests=4096",
        ],
    )
    paths = prepare_run(hp, root, run_name)
    context = build_context(hp, run_name, 0)
    batch = write_batch(paths, context)
    grow_all_trees(paths, context, batch)
    return finished_stage(paths, context, "rollouts")["info"]["nodes"]


def cli_overrides(datapoints: int) -> list[str]:
    """The default configuration made the benchmark's: OpenAI-compatible agents, all frozen."""
    settings = [
        "agents._default.model_provider=OpenAI",
        "agents._default.freeze_agent=true",
        "pure_text_malt.frozen_agents_generate_one_response=false",
        "interaction_protocol=nip",
        f"nip_protocol.max_message_rounds={ROUNDS}",
        f"pure_text_malt.num_responses_per_timestep={K}",
        f"rl.rollouts_per_iteration={datapoints}",
        "text_rl.max_concurrent_requests=4096",
        "text_rl.switch_guard=false",
    ]
    return [word for setting in settings for word in ("--set", setting)]


def cli_rollout_stage(url: str, root: str, run_name: str, datapoints: int) -> int:
    """`python -m flows.malt_iteration` against `url` in a child process; returns the nodes and
    leaves the rollout stage's seconds in the manifest."""
    command = [sys.executable, "-m", "flows.malt_iteration", *cli_overrides(datapoints)]
    command += ["--run-name", run_name, "--artifacts-root", root, "--no-wandb"]
    env = os.environ | {
        "OPENAI_BASE_URL": f"{url}/v1",
        "OPENAI_API_KEY": "sk-bench-loopback",  # the loopback server reads no key
        "PYTHONPATH": str(REPO),
    }
    done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"malt_iteration exited with {done.returncode}:\n{done.stderr[-3000:]}")
    return rollout_entry(root, run_name)["info"]["nodes"]


def rollout_entry(root: str, run_name: str) -> dict:
    manifest = Path(root, run_name, "iterations", "0000", "manifest.json")
    return json.loads(manifest.read_text())["stages"]["rollouts"]


def tree_levels(arrivals: list[float], latency: float) -> list[tuple[float, float]]:
    """(start, end) of each burst of requests: a tree level's calls all leave at once, and the
    next level's no sooner than `latency` after."""
    levels: list[list[float]] = []
    for t in sorted(arrivals):
        if levels and t - levels[-1][-1] < latency / 2:
            levels[-1].append(t)
        else:
            levels.append([t])
    return [(level[0], level[-1]) for level in levels]


def measure_cli(url: str, datapoints: int, latency: float) -> dict[str, float]:
    """The stage's wall from the manifest, and where it went: the spread of the first level's
    requests, and the time outside the first request's departure and the last answer."""
    with tempfile.TemporaryDirectory() as root:
        before = httpx.get(f"{url}/stats").json()
        nodes = cli_rollout_stage(url, root, f"bench-{datapoints}", datapoints)
        after = httpx.get(f"{url}/stats").json()
        wall = rollout_entry(root, f"bench-{datapoints}")["seconds"]
    calls = after["calls"] - before["calls"]
    levels = tree_levels(after["arrivals"][len(before["arrivals"]) :], latency)
    in_calls = levels[-1][1] + latency - levels[0][0]
    return {
        "nodes": nodes,
        "calls": calls,
        "ratio": wall / (ROUNDS * latency),
        "calls_per_s": calls / wall,
        "first_level_spread_s": levels[0][1] - levels[0][0],
        "later_level_spread_s": max((end - start for start, end in levels[1:]), default=0.0),
        "outside_calls_s": wall - in_calls,
        "levels": len(levels),
    }


def measure(url: str, datapoints: int, latency: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as root:
        before = httpx.get(f"{url}/stats").json()["calls"]
        cpu, wall = time.process_time(), time.perf_counter()
        nodes = rollout_stage(url, root, f"bench-{datapoints}", datapoints)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        calls = httpx.get(f"{url}/stats").json()["calls"] - before
    return {
        "nodes": nodes,
        "calls": calls,
        "ratio": wall / (ROUNDS * latency),
        "calls_per_s": calls / wall,
        "cpu_ms_per_call": 1000 * cpu / max(calls, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--latency", type=float, default=0.2, help="seconds per request")
    parser.add_argument("--sizes", default="32,512", help="datapoints per run, comma-separated")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--port", type=int, help="the loopback server's port (default: a free one)")
    parser.add_argument(
        "--via",
        choices=["stage", "cli"],
        default="stage",
        help="the rollout stage in this process (SelfHosted), or the whole command (OpenAI)",
    )
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.latency)
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    summary = {}
    one_run, keys = measure, ("ratio", "calls_per_s", "cpu_ms_per_call")
    if args.via == "cli":
        one_run = measure_cli
        keys = ("ratio", "calls_per_s", "first_level_spread_s", "later_level_spread_s")
        keys += ("outside_calls_s", "levels")
    with loopback_server(args.latency, args.port) as url:
        if args.via == "stage":
            rollout_stage(url, tempfile.mkdtemp(), "warm-up", 2)  # imports, templates, connections
        for size in sizes:
            runs = [one_run(url, size, args.latency) for _ in range(args.repeats)]
            for key in keys:
                values = [r[key] for r in runs]
                print(
                    f"{size} datapoints ({runs[0]['calls']} calls, {runs[0]['nodes']} nodes): "
                    f"{key} min {min(values):.2f} median {statistics.median(values):.2f}"
                )
            summary[size] = statistics.median(r["ratio"] for r in runs)
    smallest = min(summary)
    print(f"ratio wall/(rounds x latency) at {smallest} datapoints: {summary[smallest]:.2f}")


if __name__ == "__main__":
    main()
