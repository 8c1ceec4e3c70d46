"""The transformers engine: serves a causal LM and its PEFT adapters on CPU or one CUDA GPU.

Requests join one running batch between decode steps (continuous batching, `hf_decode.py`),
whatever their `n`, temperature, top-p, penalty and seed: each sequence samples with its own
settings and seeded noise (`hf_noise.py`). A batch serves one model or adapter (others wait for
it to drain, `hf_batching.candidates`) within limits derived from the device or given on the
command line (`hf_batching.device_limits`). All model work runs on one worker thread, a decode
step per call, so the event loop stays responsive; adapter unloads and weight releases wait for
the batch to drain. The event loop tokenizes prompts with a tokenizer of its own (a fast
tokenizer's padding state is not thread-safe).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import nip_core.lm_server.engines.hf_decode as hf_decode
from nip_core.lm_server.engines.base import AdapterError, ChatChoice, ChatRequest
from nip_core.lm_server.engines.hf_batching import (
    PREFILL_TOKENS,
    Job,
    Load,
    admitted,
    candidates,
    completed,
    device_limits,
    kv_bytes_per_token,
    peft_adapter_name,
    prefill_groups,
    settle,
    stop_ids,
)
from nip_core.lm_server.hardware import resolved_cpu_dtype

log = logging.getLogger(__name__)


class TransformersEngine:
    """A Hugging Face model with named LoRA adapters (and full fine-tuned checkpoints)."""

    name = "transformers"

    def __init__(
        self,
        model: str,
        *,
        max_sequences: int | None = None,
        max_batch_tokens: int | None = None,
        default_max_tokens: int = 512,
        cpu_dtype: str = "auto",
        **_: Any,
    ) -> None:
        self.model_name = model
        self.cpu_dtype = resolved_cpu_dtype(cpu_dtype)  # bf16 where native, else fp32
        # Batch limits: derived from the device on load (`device_limits`) unless given here.
        self.limits_given = (max_sequences, max_batch_tokens)
        self.max_sequences = max_sequences or 0
        self.max_batch_tokens = max_batch_tokens or 0
        self.default_max_tokens = default_max_tokens
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf-engine")
        self._pending: list[Job] = []  # event-loop side: waiting to join the batch
        self._in_flight: list[Job] = []  # event-loop side: their sequences are in the batch
        self._wake = asyncio.Event()
        self._idle = asyncio.Lock()  # held by the worker loop while a batch runs
        self._exclusive_waiting = 0  # adapter swaps and releases waiting for the batch to drain
        self._load_now = Load()
        self._batch_model = ""
        self._batch: hf_decode.Batch | None = None  # worker-thread side
        self._worker: asyncio.Task | None = None
        self._adapters: dict[str, str] = {}  # LoRA adapters inside the PeftModel
        self._peft_names: dict[str, str] = {}  # served name -> PEFT adapter name (no dots)
        self._full: dict[str, Any] = {}  # full fine-tuned checkpoints, served as their own model
        self._full_paths: dict[str, str] = {}
        self.base = self.model = self.tokenizer = self.counting_tokenizer = None
        self.device = "cpu"

    # ---- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        await self._run(self._load)
        self._worker = asyncio.create_task(self._serve())

    async def stop(self) -> None:
        if self._worker:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
        self._executor.shutdown(wait=True)

    def _load(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype = getattr(torch, self.cpu_dtype)
        if self.device == "cuda":
            dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_name)
        if self.counting_tokenizer is None:  # used on the event-loop thread only
            self.counting_tokenizer = AutoTokenizer.from_pretrained(self.model_name)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self._stops = stop_ids(self.tokenizer)
        base = AutoModelForCausalLM.from_pretrained(self.model_name, dtype=dtype)
        self.base = self.model = base.to(self.device).eval()
        free = torch.cuda.mem_get_info()[0] if self.device == "cuda" else 0
        kv_bytes = kv_bytes_per_token(base.config, torch.finfo(dtype).bits // 8)
        sequences, tokens = device_limits(self.device, kv_bytes, free)
        self.max_sequences = self.limits_given[0] or sequences
        self.max_batch_tokens = self.limits_given[1] or tokens

    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    @asynccontextmanager
    async def _exclusive(self):
        """Wait until no batch runs, keeping new ones from starting, to change the weights."""
        self._exclusive_waiting += 1
        self._wake.set()
        try:
            async with self._idle:
                yield
        finally:
            self._exclusive_waiting -= 1
            self._wake.set()

    async def release_accelerator(self) -> None:
        async with self._exclusive():
            if self.device == "cuda":
                await self._run(self._move, "cpu")
            else:
                # On CPU the training child shares our RAM: drop the weights (the next request
                # or `reacquire_accelerator` reloads them, with every adapter) and hand the
                # freed heap, generation buffers included, back to the OS before it starts.
                await self._run(self._drop_weights)

    async def reacquire_accelerator(self) -> None:
        async with self._exclusive():
            if self.device == "cuda":
                await self._run(self._move, "cuda")
            else:
                await self._run(self._ensure_weights)

    @property
    def weights_loaded(self) -> bool:
        return self.base is not None

    def _drop_weights(self) -> None:
        self.base = self.model = None
        self._full.clear()
        _return_free_memory()

    def _ensure_weights(self) -> None:
        """Reload the base model, then every adapter and checkpoint in the order they came."""
        if self.weights_loaded:
            return
        self._load()
        adapters, self._adapters = self._adapters, {}
        for name, path in adapters.items():
            self._load_lora(name, Path(path))
        for name, path in self._full_paths.items():
            self._load_full(name, Path(path))

    def _move(self, device: str) -> None:
        import torch

        for model in (self.model, *self._full.values()):
            model.to(device)
        if device == "cpu":
            torch.cuda.empty_cache()

    # ---- models and adapters -----------------------------------------------------------------

    def models(self) -> list[str]:
        return [self.model_name, *self._adapters, *self._full]

    def count_tokens(self, text: str) -> int:
        return len(self.counting_tokenizer(text, add_special_tokens=False)["input_ids"])

    async def load_adapter(self, name: str, path: str) -> None:
        if name in self.models():
            raise AdapterError(f"a model named {name!r} is already loaded")
        directory = Path(path)
        if not directory.is_dir():
            raise AdapterError(f"adapter path {path!r} does not exist or is not a directory")
        if (directory / "adapter_config.json").exists():
            await self._run(self._load_lora, name, directory)
        elif (directory / "config.json").exists():
            await self._run(self._load_full, name, directory)
        else:
            raise AdapterError(f"{path!r} holds neither adapter_config.json nor config.json")

    def _load_lora(self, name: str, directory: Path) -> None:
        from peft import PeftModel

        config = json.loads((directory / "adapter_config.json").read_text())
        if "r" not in config:
            raise AdapterError(f"{directory} has no usable LoRA adapter config")
        self._ensure_weights()
        peft_name = peft_adapter_name(name)
        try:
            if not self._adapters:
                model = PeftModel.from_pretrained(self.base, str(directory), adapter_name=peft_name)
                self.model = model.eval()
            else:
                self.model.load_adapter(str(directory), adapter_name=peft_name)
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            raise AdapterError(f"could not load adapter from {directory}: {exc}") from exc
        self._adapters[name] = str(directory)
        self._peft_names[name] = peft_name

    def _load_full(self, name: str, directory: Path) -> None:
        from transformers import AutoModelForCausalLM

        self._ensure_weights()
        model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=self.base.dtype)
        self._full[name] = model.to(self.device).eval()
        self._full_paths[name] = str(directory)

    async def unload_adapter(self, name: str) -> None:
        if name not in self._adapters and name not in self._full:
            raise AdapterError(f"no adapter named {name!r} is loaded")
        async with self._exclusive():
            await self._run(self._unload, name)

    def _unload(self, name: str) -> None:
        self._ensure_weights()
        if self._full.pop(name, None) is not None:
            del self._full_paths[name]
            return
        del self._adapters[name]
        peft_name = self._peft_names.pop(name)
        if self._adapters:
            self.model.delete_adapter(peft_name)
        else:  # the last adapter: strip the LoRA layers and serve the plain base model again
            self.base = self.model = self.model.unload().eval()

    # ---- generation --------------------------------------------------------------------------

    async def chat(self, request: ChatRequest) -> list[ChatChoice]:
        if request.model not in self.models():
            raise AdapterError(f"model {request.model!r} is not loaded")
        text = self.counting_tokenizer.apply_chat_template(
            request.messages, add_generation_prompt=True, tokenize=False
        )
        prompt = self.counting_tokenizer(text, add_special_tokens=False)["input_ids"]
        future = asyncio.get_running_loop().create_future()
        self._pending.append(
            Job(request, future, prompt, time.monotonic(), self.default_max_tokens)
        )
        self._wake.set()
        return await future

    async def _serve(self) -> None:
        """Start a batch whenever requests wait (and no change of weights does)."""
        while True:
            if not self._pending or self._exclusive_waiting:
                self._wake.clear()
                await self._wake.wait()
                continue
            await settle(lambda: len(self._pending))
            async with self._idle:
                try:
                    await self._run_batch()
                except Exception as exc:  # answer every caller in the batch, keep serving
                    self._batch, self._load_now = None, Load()  # the worker raised: it is idle
                    failed, self._in_flight = self._in_flight, []
                    for job in failed:
                        if not job.future.done():
                            job.future.set_exception(exc)

    async def _run_batch(self) -> None:
        """Advance the batch a step at a time until it drains, admitting requests between
        steps, and answer each caller as its last sequence finishes."""
        self._fail_unserved()
        if not self._pending:
            return
        self._batch_model, started, served = self._pending[0].request.model, time.monotonic(), 0
        while True:
            jobs = self._admit()
            served += len(jobs)
            if not jobs and not self._load_now.rows:
                break
            finished, self._load_now = await self._run(self._advance, jobs, self._batch_model)
            self._deliver(finished)
        log.info("batch of %s: %d requests, %.1f s", self._batch_model, served,
                 time.monotonic() - started)  # fmt: skip

    def _fail_unserved(self) -> None:
        """Answer the waiting requests whose model was unloaded meanwhile with an error."""
        for job in [j for j in self._pending if j.request.model not in self.models()]:
            self._pending.remove(job)
            if not job.future.done():
                job.future.set_exception(AdapterError(f"model {job.request.model!r} is unloaded"))

    def _admit(self) -> list[Job]:
        """The waiting jobs that join the batch now (none while a change of weights waits)."""
        self._pending = [job for job in self._pending if not job.future.done()]  # hung up
        if self._exclusive_waiting or not self._pending:
            return []
        self._fail_unserved()
        jobs = candidates(self._pending, self._batch_model)
        sizes = [(job.samples, len(job.prompt), job.max_new) for job in jobs]
        chosen = jobs[: admitted(sizes, self._load_now, self.max_sequences, self.max_batch_tokens)]
        taken = {id(job) for job in chosen}
        self._pending = [job for job in self._pending if id(job) not in taken]
        for job in chosen:
            job.choices = [None] * job.samples
        self._in_flight += chosen
        return chosen

    def _deliver(self, finished: list[tuple[Job, int, ChatChoice]]) -> None:
        for job in completed(finished):
            self._in_flight.remove(job)
            if not job.future.done():
                job.future.set_result(job.answers())

    def _advance(self, jobs: list[Job], name: str) -> tuple[list, Load]:
        """One decode step of the running batch, then the prefill (and first token) of the
        jobs joining it: the sequences that finished, and the batch's new size."""
        import torch

        self._ensure_weights()
        model = self._select(name)
        finished: list[tuple[Job, int, ChatChoice]] = []
        batch, stops, answer = self._batch, self._stops, self._choice
        with torch.inference_mode(), self._adapter_scope(model, name):
            if batch is not None and batch.size:
                tokens = hf_decode.sample(batch, hf_decode.decode(model, batch))
                # With newcomers, drop every answered row before their merge copies the cache.
                share = 0 if jobs else hf_decode.COMPACT_SHARE
                batch, finished = hf_decode.retire(batch, tokens, stops, answer, share)
            jobs = sorted(jobs, key=lambda job: len(job.prompt))  # less padding per prefill
            budget = min(self.max_batch_tokens, PREFILL_TOKENS)
            pad, device = self.tokenizer.pad_token_id, self.device
            for group in prefill_groups([len(job.prompt) for job in jobs], budget):
                fresh, logits = hf_decode.start(model, [jobs[i] for i in group], pad, device)
                tokens = hf_decode.sample(fresh, logits)
                fresh, ended = hf_decode.retire(fresh, tokens, stops, answer, share=0)
                batch, finished = hf_decode.merge(batch, fresh, pad), finished + ended
        self._batch = batch if batch is not None and batch.size else None
        if self._batch is None:
            return finished, Load()
        return finished, Load(batch.size, batch.width, batch.remaining())

    async def score(self, model: str, conversations: list[list[dict]]) -> list[tuple[float, int]]:
        """(log-probability, tokens) of each conversation's last message under `model`."""
        if model not in self.models():
            raise AdapterError(f"model {model!r} is not loaded")
        return await self._run(self._score, model, conversations)

    def _score(self, name: str, conversations: list[list[dict]]) -> list[tuple[float, int]]:
        import torch

        from nip_core.lm_server.engines.hf_scoring import message_logprobs

        self._ensure_weights()
        model = self._select(name)
        with torch.inference_mode(), self._adapter_scope(model, name):
            return message_logprobs(
                model, self.tokenizer, conversations, self.device, self.max_batch_tokens
            )

    def _select(self, name: str):
        return self._full.get(name, self.model)

    def _adapter_scope(self, model, name: str):
        """Activate adapter `name`, or disable adapters for the base model."""
        from contextlib import nullcontext

        if name in self._adapters:
            model.set_adapter(self._peft_names[name])
            return nullcontext()
        if model is self.model and self._adapters:
            return model.disable_adapter()
        return nullcontext()

    def _choice(self, ids: list[int]) -> ChatChoice:
        end = next((i for i, t in enumerate(ids) if t in self._stops), None)
        if end is None:
            return ChatChoice(self.tokenizer.decode(ids, skip_special_tokens=True), "length")
        return ChatChoice(self.tokenizer.decode(ids[:end], skip_special_tokens=True), "stop")


def _return_free_memory() -> None:
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass
