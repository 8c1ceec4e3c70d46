"""The FastAPI app of the language-model server: OpenAI-shaped chat, files and fine-tuning.

Build it with `create_app(engine, state_dir, token=None)`; run it with `python -m
nip_core.lm_server`. Every route except `/health` needs `Authorization: Bearer <token>` when a token
is set. Errors use OpenAI's `{"error": {"message", "type", "param", "code"}}` shape so the `openai`
SDK raises its usual exceptions.
"""

from __future__ import annotations

import hmac
import os
import secrets
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request, UploadFile
from fastapi.responses import JSONResponse

import nip_core
from nip_core.lm_server import candidates as closed_set
from nip_core.lm_server.engines.base import (
    AdapterError,
    ChatChoice,
    ChatRequest,
    InferenceEngine,
)
from nip_core.lm_server.jobs import JobError, JobManager, public_job
from nip_core.lm_server.store import StateDir
from nip_core.model_api.chat_format import fold_speaker_names
from nip_core.model_api.temperatures import CANDIDATES_MAX_TEMPERATURE

_SAMPLING = {
    "temperature": (float, 0.0, CANDIDATES_MAX_TEMPERATURE),  # decoded: <= 2
    "top_p": (float, 0.0, 1.0),
    "max_tokens": (int, 1, 32768),
    "seed": (int, None, None),
    "repetition_penalty": (float, 0.0, None),
}


def _error(status: int, message: str, param: str | None = None, code: str | None = None):
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return JSONResponse(body, status_code=status)


def _sampling_value(body: dict, key: str) -> Any:
    """One optional sampling field, type- and range-checked."""
    value = body.get(key)
    if key == "max_tokens" and value is None:
        value = body.get("max_completion_tokens")
    if value is None:
        return None
    kind, low, high = _SAMPLING[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or kind(value) != value:
        raise JobError(f"{key} must be a {kind.__name__}, got {value!r}", 400, key)
    if (low is not None and value < low) or (high is not None and value > high):
        raise JobError(f"{key}={value!r} is out of range", 400, key)
    return kind(value)


def _chat_request(body: dict, engine_model: str) -> ChatRequest:
    messages = body.get("messages")
    if (
        not isinstance(messages, list)
        or not messages
        or not all(
            isinstance(m, dict)
            and isinstance(m.get("content"), str)
            and "role" in m
            and isinstance(m.get("name") or "", str)
            for m in messages
        )
    ):
        raise JobError(
            "messages must be a non-empty list of {role, content} objects", 400, "messages"
        )
    n = body.get("n", 1) or 1
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 256:
        raise JobError(f"n must be an integer in [1, 256], got {n!r}", 400, "n")
    clean = fold_speaker_names(messages)  # chat templates drop `name`: keep who spoke
    sampling = {key: _sampling_value(body, key) for key in _SAMPLING}
    try:
        closed_set.check_temperature(sampling["temperature"], body.get("candidates") is not None)
    except ValueError as exc:
        raise JobError(str(exc), 400, "temperature") from None
    return ChatRequest(model=engine_model, messages=clean, n=n, **sampling)


def _score_conversations(body: dict) -> list[list[dict]]:
    """The `conversations` of a score request: 1-256 chats, each ending with the scored reply."""
    conversations = body.get("conversations")
    if not isinstance(conversations, list) or not 1 <= len(conversations) <= 256:
        raise JobError("conversations must be a list of 1 to 256 chats", 400, "conversations")
    chats = []
    for conversation in conversations:
        messages = _chat_request({"messages": conversation}, "").messages
        if conversation[-1].get("role") != "assistant":
            raise JobError("each conversation must end with an assistant message", 400)
        chats.append(messages)
    return chats


def _count_tokens(engine: InferenceEngine, text: str) -> int:
    """Token count from the engine when it can tell, else a whitespace estimate."""
    counter = getattr(engine, "count_tokens", None)
    return int(counter(text)) if counter else len(text.split())


def create_app(
    engine: InferenceEngine,
    state_dir: str | Path,
    token: str | None = None,
    *,
    base_name: str | None = None,
    owner: str | None = None,
    max_body_bytes: int = 8 * 2**20,
    max_file_bytes: int = 512 * 2**20,
    **job_opts: Any,
) -> FastAPI:
    """The server app for `engine`; `base_name` is the public name of the engine's base model,
    `owner` who started it (reported by /health beside the state folder and the process id).
    Request bodies over `max_body_bytes` (uploaded files: `max_file_bytes`) get HTTP 413."""
    state = StateDir(state_dir)
    public_base = base_name or engine.models()[0]
    jobs = JobManager(engine, state, public_base, **job_opts)

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        await engine.start()
        await jobs.start()
        try:
            yield
        finally:
            await jobs.stop()
            await engine.stop()

    app = FastAPI(title="nip-malt language-model server", lifespan=lifespan)
    app.state.jobs = jobs
    app.add_middleware(BodySizeLimit, limit=max_body_bytes, file_limit=max_file_bytes)
    _add_auth_and_errors(app, token)
    identity = {
        "status": "ok",
        "version": nip_core.__version__,
        "engine": engine.name,
        "owner": owner,
        "state_dir": str(state.root.resolve()),
        "pid": os.getpid(),
    }

    @app.get("/health")
    async def health():
        return identity

    _add_model_routes(app, engine, jobs, public_base)
    _add_file_routes(app, state)
    _add_job_routes(app, jobs)
    _add_adapter_routes(app, jobs)
    return app


class BodySizeLimit:
    """ASGI middleware: HTTP 413 for a body over the limit, before it is read whole (by its
    Content-Length, or while it streams in when there is none)."""

    def __init__(self, app: Any, limit: int, file_limit: int) -> None:
        self.app, self.limit, self.file_limit = app, limit, file_limit

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.file_limit if scope["path"] == "/v1/files" else self.limit
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await _too_large(send, limit)
            return
        seen = 0

        async def counted() -> dict:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > limit:
                raise _BodyTooLarge
            return message

        try:
            await self.app(scope, counted, send)
        except _BodyTooLarge:
            await _too_large(send, limit)


class _BodyTooLarge(Exception):
    pass


async def _too_large(send: Any, limit: int) -> None:
    response = _error(413, f"request body over {limit} bytes", code="request_too_large")
    await response({"type": "http"}, None, send)


def _add_auth_and_errors(app: FastAPI, token: str | None) -> None:
    @app.middleware("http")
    async def check_token(request: Request, call_next):
        if token and request.url.path != "/health":
            sent = request.headers.get("authorization", "")
            if not hmac.compare_digest(sent.encode(), f"Bearer {token}".encode()):
                return _error(401, "missing or wrong bearer token", code="invalid_api_key")
        return await call_next(request)

    @app.exception_handler(JobError)
    async def job_error(_: Request, exc: JobError):
        return _error(exc.status, str(exc), exc.param)

    @app.exception_handler(AdapterError)
    async def adapter_error(_: Request, exc: AdapterError):
        return _error(400, str(exc), "lora_path")


def _add_model_routes(
    app: FastAPI, engine: InferenceEngine, jobs: JobManager, public_base: str
) -> None:
    """/health, /v1/models and /v1/chat/completions."""

    def engine_name(model: Any) -> str:
        if model == public_base:
            return engine.models()[0]
        if isinstance(model, str) and model in engine.models()[1:]:
            return model
        known = ", ".join([public_base, *engine.models()[1:]])
        raise JobError(f"model {model!r} is not served here; available: {known}", 404, "model")

    @app.get("/v1/models")
    async def models():
        names = [public_base, *engine.models()[1:]]
        data = [{"id": n, "object": "model", "created": 0, "owned_by": "nip-malt"} for n in names]
        for item in data[1:]:
            item["parent"] = jobs.adapters.get(item["id"], {}).get("root_name", public_base)
        return {"object": "list", "data": data}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await _json_body(request)
        chat_request = _chat_request(body, engine_name(body.get("model")))
        if body.get("candidates") is not None:
            choices = await _chosen_replies(engine, chat_request, body["candidates"])
        else:
            choices = await engine.chat(chat_request)
        return _completion(engine, body["model"], chat_request, choices)

    @app.post("/v1/chat/score")
    async def score(request: Request):
        """Ours: the log-likelihood of each conversation's last (assistant) message."""
        body = await _json_body(request)
        model = engine_name(body.get("model"))
        conversations = _score_conversations(body)
        scorer = getattr(engine, "score", None)
        if scorer is None:
            raise JobError(f"the {engine.name} engine cannot score messages", 501)
        scores = await scorer(model, conversations)
        data = [
            {"index": i, "logprob": logprob, "tokens": tokens}
            for i, (logprob, tokens) in enumerate(scores)
        ]
        return {"object": "list", "model": body["model"], "data": data}


async def _chosen_replies(
    engine: InferenceEngine, request: ChatRequest, candidates: Any
) -> list[ChatChoice]:
    """`request.n` replies drawn from `candidates` by the model's scores of each as the reply
    (ours, `nip_core.lm_server.candidates`)."""
    try:
        texts = closed_set.check_candidates(candidates)
    except ValueError as exc:
        raise JobError(str(exc), 400, "candidates") from None
    scorer = getattr(engine, "score", None)
    if scorer is None:
        raise JobError(f"the {engine.name} engine cannot score candidates", 501, "candidates")
    chats = [[*request.messages, {"role": "assistant", "content": text}] for text in texts]
    scores = await scorer(request.model, chats)
    drawn = closed_set.draw_candidates(scores, request.n, request.temperature, request.seed)
    return [ChatChoice(texts[i], "stop") for i in drawn]


def _completion(engine: InferenceEngine, model: str, request: ChatRequest, choices: list) -> dict:
    """The OpenAI `chat.completion` object for `choices`, with token usage."""
    prompt_text = "\n".join(m["content"] for m in request.messages)
    completion = sum(_count_tokens(engine, c.text) for c in choices)
    prompt = _count_tokens(engine, prompt_text)
    return {
        "id": f"chatcmpl-{secrets.token_hex(12)}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": i,
                "message": {"role": "assistant", "content": c.text},
                "finish_reason": c.finish_reason,
                "logprobs": None,
            }
            for i, c in enumerate(choices)
        ],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }


def _add_file_routes(app: FastAPI, state: StateDir) -> None:
    @app.post("/v1/files")
    async def upload(file: UploadFile, request: Request):
        form = await request.form()
        purpose = form.get("purpose")
        if purpose != "fine-tune":
            raise JobError(f"purpose must be 'fine-tune', got {purpose!r}", 400, "purpose")
        return state.save_file(file.filename or "upload.jsonl", purpose, await file.read())

    @app.get("/v1/files/{file_id}")
    async def file_info(file_id: str):
        meta = _lookup(state.file_meta, file_id)
        if meta is None:
            raise JobError(f"file {file_id!r} not found", 404, "file_id")
        return meta


def _add_job_routes(app: FastAPI, jobs: JobManager) -> None:
    @app.post("/v1/fine_tuning/jobs")
    async def create_job(request: Request):
        return await jobs.create(await _json_body(request))

    @app.get("/v1/fine_tuning/jobs")
    async def list_jobs(request: Request, limit: int = 20, after: str | None = None):
        metadata = {
            key[len("metadata[") : -1]: value
            for key, value in request.query_params.items()
            if key.startswith("metadata[") and key.endswith("]")
        }
        data, more = jobs.list(limit=limit, after=after, metadata=metadata)
        return {"object": "list", "data": data, "has_more": more}

    @app.get("/v1/fine_tuning/jobs/{job_id}")
    async def get_job(job_id: str):
        return public_job(jobs.get(job_id))

    @app.post("/v1/fine_tuning/jobs/{job_id}/cancel")
    async def cancel_job(job_id: str):
        return await jobs.cancel(job_id)

    @app.get("/v1/fine_tuning/jobs/{job_id}/events")
    async def job_events(job_id: str, limit: int = 20, after: str | None = None):
        data, more = jobs.events(job_id, limit=limit, after=after)
        return {"object": "list", "data": data, "has_more": more}


def _add_adapter_routes(app: FastAPI, jobs: JobManager) -> None:
    """vLLM's runtime LoRA endpoints."""

    @app.post("/v1/load_lora_adapter")
    async def load_lora(request: Request):
        body = await _json_body(request)
        name, path = body.get("lora_name"), body.get("lora_path")
        if not isinstance(name, str) or not isinstance(path, str):
            raise JobError("lora_name and lora_path are required strings", 400, "lora_name")
        await jobs.load_adapter(name, path)
        return {"status": "ok", "message": f"LoRA adapter {name!r} loaded from {path}"}

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora(request: Request):
        name = (await _json_body(request)).get("lora_name")
        if not isinstance(name, str):
            raise JobError("lora_name is a required string", 400, "lora_name")
        await jobs.unload_adapter(name)
        return {"status": "ok", "message": f"LoRA adapter {name!r} unloaded"}


def _lookup(getter, key: str):
    """Call a state getter, treating malformed ids as not found."""
    try:
        return getter(key)
    except KeyError:
        return None


async def _json_body(request: Request) -> dict:
    try:
        body = await request.json()
    except ValueError:
        raise JobError("the request body is not valid JSON", 400) from None
    if not isinstance(body, dict):
        raise JobError("the request body must be a JSON object", 400)
    return body
