"""The transformers engine: serves a causal LM and its PEFT adapters on CPU or one CUDA GPU.

Pending requests are collected into few, large `generate` calls (left padding, n samples through
`num_return_sequences`), grouped by model/adapter and sampling settings because one call takes one
set of them. Within a group, requests are sorted by prompt length and packed into calls bounded
by a sequence count and a token budget (sequences x (longest prompt + new tokens), which bounds
the KV cache): large batches are what make CPU generation fast (about 2x tokens/s from batch 8 to
64 on the embedded model), and length buckets keep padding low. All model work runs on a single
worker thread, so the event loop stays responsive and adapter swaps never race a generation; the
event loop counts tokens with a tokenizer of its own (a fast tokenizer's padding state is not
thread-safe).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from nip_core.lm_server.engines.base import AdapterError, ChatChoice, ChatRequest
from nip_core.lm_server.engines.hf_batching import (
    SeededSampler,
    _chunks,
    _greedy_kwargs,
    _groups,
    _Pending,
    _sampling_kwargs,
    _stop_ids,
    generate_with_shared_prompts,
    peft_adapter_name,
    sequence_seeds,
)

log = logging.getLogger(__name__)


class TransformersEngine:
    """A Hugging Face model with named LoRA adapters (and full fine-tuned checkpoints)."""

    name = "transformers"

    def __init__(
        self,
        model: str,
        *,
        max_batch: int = 512,
        max_sequences: int = 64,
        max_batch_tokens: int = 16_384,
        default_max_tokens: int = 512,
        **_: Any,
    ) -> None:
        self.model_name = model
        self.max_batch = max_batch
        # One `generate` call holds at most `max_sequences` sequences and
        # `max_batch_tokens` = sequences x (longest prompt + max new tokens): the token budget
        # bounds the KV cache (about 46 kB a token for SmolLM2-135M in fp32, so ~0.75 GB).
        self.max_sequences = max_sequences
        self.max_batch_tokens = max_batch_tokens
        self.default_max_tokens = default_max_tokens
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf-engine")
        self._queue: asyncio.Queue[_Pending] | None = None
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
        self._queue = asyncio.Queue()
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
        dtype = torch.float32
        if self.device == "cuda":
            dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_name)
        if self.counting_tokenizer is None:  # used on the event-loop thread only
            self.counting_tokenizer = AutoTokenizer.from_pretrained(self.model_name)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        base = AutoModelForCausalLM.from_pretrained(self.model_name, dtype=dtype)
        self.base = self.model = base.to(self.device).eval()

    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def release_accelerator(self) -> None:
        if self.device == "cuda":
            await self._run(self._move, "cpu")
        else:
            # On CPU the training child shares our RAM: drop the weights (the next request or
            # `reacquire_accelerator` reloads them, with every adapter) and hand the freed heap,
            # generation buffers included, back to the OS before the child starts.
            await self._run(self._drop_weights)

    async def reacquire_accelerator(self) -> None:
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
        future = asyncio.get_running_loop().create_future()
        await self._queue.put((request, future))
        return await future

    async def _settle(self, step: float = 0.01, limit: float = 0.1) -> None:
        """Wait while requests keep arriving (at most `limit` seconds).

        A client sends a tree level's requests together, but the HTTP server parses them over
        some milliseconds; without this pause the first `generate` call would take only the
        first few and the rest would wait for it to finish.
        """
        waited, size = 0.0, self._queue.qsize()
        while waited < limit:
            await asyncio.sleep(step)
            waited += step
            if self._queue.qsize() == size:
                return
            size = self._queue.qsize()

    async def _serve(self) -> None:
        """Take everything pending, run it in compatible groups, answer each caller."""
        while True:
            batch = [await self._queue.get()]
            await self._settle()
            while not self._queue.empty() and len(batch) < self.max_batch:
                batch.append(self._queue.get_nowait())
            for group in _chunks(
                _groups(batch),
                self.max_sequences,
                self.max_batch_tokens,
                self._prompt_length,
                self.default_max_tokens,
            ):
                try:
                    started = time.perf_counter()
                    results = await self._run(self._generate, [r for r, _ in group])
                    log.info(
                        "generate: %d requests, %d sequences, %.1f s",
                        len(group),
                        sum(r.n for r, _ in group),
                        time.perf_counter() - started,
                    )
                except Exception as exc:  # answer every caller, keep serving
                    for _, future in group:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                for (_, future), choices in zip(group, results, strict=True):
                    if not future.done():
                        future.set_result(choices)

    def _prompt_text(self, request: ChatRequest, tokenizer=None) -> str:
        return (tokenizer or self.tokenizer).apply_chat_template(
            request.messages, add_generation_prompt=True, tokenize=False
        )

    def _prompt_length(self, request: ChatRequest) -> int:
        """Prompt tokens of a request, counted on the event-loop thread (for batch packing)."""
        return self.count_tokens(self._prompt_text(request, self.counting_tokenizer))

    def _generate(self, requests: list[ChatRequest]) -> list[list[ChatChoice]]:
        import torch

        first = requests[0]
        self._ensure_weights()
        model = self._select(first.model)
        texts = [self._prompt_text(r) for r in requests]
        distinct = {text: i for i, text in enumerate(dict.fromkeys(texts))}
        greedy = first.temperature == 0
        samples = 1 if greedy else first.n
        # Sequence -> its distinct prompt: the n samples of a request, and identical prompts
        # of several requests (an evaluation's repeated episodes), share one prefill.
        rows = torch.tensor([distinct[t] for t in texts for _ in range(samples)])
        inputs = self.tokenizer(
            list(distinct), return_tensors="pt", padding=True, add_special_tokens=False
        ).to(self.device)
        kwargs = _sampling_kwargs(first, greedy, 1, self.default_max_tokens)
        if not greedy:  # each sequence samples from its own seeded stream (see SeededSampler)
            kwargs = _greedy_kwargs(kwargs) | {
                "logits_processor": [
                    SeededSampler(
                        sequence_seeds(requests, samples),
                        temperature=first.temperature or 1.0,
                        top_p=first.top_p or 1.0,
                    )
                ]
            }
        with torch.inference_mode(), self._adapter_scope(model, first.model):
            output = generate_with_shared_prompts(
                model,
                inputs["input_ids"],
                inputs["attention_mask"],
                rows.to(self.device),
                pad_token_id=self.tokenizer.pad_token_id,
                **kwargs,
            )
        new_tokens = output[:, inputs["input_ids"].shape[1] :]
        choices = [self._choice(row) for row in new_tokens]
        per_request = [choices[i * samples : (i + 1) * samples] for i in range(len(requests))]
        return [
            answers * (r.n if greedy else 1)
            for answers, r in zip(per_request, requests, strict=True)
        ]

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
            return message_logprobs(model, self.tokenizer, conversations, self.device)

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

    def _choice(self, tokens) -> ChatChoice:
        ids = tokens.tolist()
        stops = _stop_ids(self.tokenizer)
        end = next((i for i, t in enumerate(ids) if t in stops), None)
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
