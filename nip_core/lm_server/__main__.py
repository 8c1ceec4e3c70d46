"""Run the language-model server.

    python -m nip_core.lm_server --engine transformers|vllm|dummy --host 127.0.0.1 --port 8000 \
        [--model NAME_OR_PATH] [--state-dir DIR]

Without `--model` it serves the embedded SmolLM2-135M-Instruct (converted on first use). Set
`NIP_LM_SERVER_LOG_LEVEL=INFO` to log every generate call (size and time). Set
`NIP_LM_SERVER_TOKEN` to require `Authorization: Bearer <token>` on every route but /health.
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from nip_core.lm_server.engines import ENGINE_NAMES, make_engine
from nip_core.lm_server.engines.vllm.config import CPU_BLOCK_SIZE, CPU_MAX_NUM_SEQS
from nip_core.lm_server.hardware import CPU_DTYPES

LOOPBACK = ("127.0.0.1", "localhost", "::1")
# Idle keep-alive connections are closed by the client first: httpx (the OpenAI SDK, our chat
# client) drops them after 5 s, and a server closing at the same 5 s (uvicorn's default) races a
# request sent on the closing connection, which the client sees as "connection reset by peer".
KEEP_ALIVE_SECONDS = 75
# On SIGTERM requests still in flight get this long, then are cancelled and the engines stop (and
# with them vLLM). uvicorn's default waits for them for ever: a flow stopped in the middle of an
# evaluation waited 30 s for its server, SIGKILLed it, and left vLLM running, orphaned.
GRACEFUL_SHUTDOWN_SECONDS = 5


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m nip_core.lm_server", description=__doc__)
    parser.add_argument("--engine", choices=ENGINE_NAMES, default="transformers")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--model", help="model path or name (default: embedded SmolLM2)")
    parser.add_argument("--state-dir", help="where files, jobs and adapters are kept")
    parser.add_argument(
        "--owner",
        default=None,
        help="who started this server (a run folder): /health reports it, so another run can "
        "tell whose server answers on a port",
    )
    parser.add_argument(
        "--fake-train-seconds",
        type=float,
        default=0.0,
        help="dummy engine only: how long each fake training job takes",
    )
    _add_vllm_arguments(parser)
    _add_vllm_cpu_arguments(parser)
    _add_hf_arguments(parser)
    parser.add_argument(
        "--allow-adapters-anywhere",
        action="store_true",
        help="load_lora_adapter may read folders outside the state folder",
    )
    parser.add_argument(
        "--insecure-no-token",
        action="store_true",
        help="serve on a non-loopback address without NIP_LM_SERVER_TOKEN",
    )
    training = parser.add_argument_group("training")
    training.add_argument(
        "--train-processes", type=int, default=1, help="GPUs per job (`accelerate launch`)"
    )
    training.add_argument("--train-deepspeed-config", help="DeepSpeed config file (ZeRO)")
    training.add_argument(
        "--max-training-restarts",
        type=int,
        default=2,
        help="times a job whose training process was killed (or died with the server) trains "
        "again from the start before it fails",
    )
    return parser.parse_args(argv)


def _add_hf_arguments(parser: argparse.ArgumentParser) -> None:
    """The transformers engine's batch limits and dtype on CPU."""
    hf = parser.add_argument_group("transformers engine")
    hf.add_argument(
        "--hf-max-batch-sequences",
        type=_positive,
        default=None,
        help="sequences decoding together at most (default: 64 on CPU, 512 on CUDA)",
    )
    hf.add_argument(
        "--hf-max-batch-tokens",
        type=_positive,
        default=None,
        help="a batch's sequences x (cache width + new tokens still to come) at most, which "
        "bounds the KV cache (default: 16,384 on CPU; on CUDA half the free memory after "
        "loading over the model's KV bytes per token)",
    )
    hf.add_argument(
        "--hf-cpu-dtype",
        choices=CPU_DTYPES,
        default="auto",
        help="CPU: the model's dtype (auto: bf16 where the CPU computes it natively, else fp32)",
    )


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def hf_options(args: argparse.Namespace) -> dict:
    """The transformers engine's options from the command line (None: derived from the device)."""
    return {
        "max_sequences": args.hf_max_batch_sequences,
        "max_batch_tokens": args.hf_max_batch_tokens,
        "cpu_dtype": args.hf_cpu_dtype,
    }


def _add_vllm_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--vllm-port", type=int, default=8001, help="port of the vLLM child")
    vllm = parser.add_argument_group("vllm engine (passed to `vllm serve`)")
    vllm.add_argument("--vllm-tensor-parallel-size", type=int, default=1)
    vllm.add_argument("--vllm-data-parallel-size", type=int, default=1)
    vllm.add_argument("--vllm-gpu-memory-utilization", type=float, default=0.85)
    vllm.add_argument("--vllm-max-model-len", type=int, default=None)
    vllm.add_argument("--vllm-max-loras", type=int, default=2)
    vllm.add_argument("--vllm-max-lora-rank", type=int, default=64)
    vllm.add_argument(
        "--vllm-enforce-eager", action="store_true", help="no torch.compile: faster start"
    )
    vllm.add_argument(
        "--vllm-device",
        choices=("auto", "cpu", "gpu"),
        default="auto",
        help="auto: cpu when .venv-vllm holds vllm-cpu or there is no NVIDIA GPU",
    )
    vllm.add_argument(
        "--vllm-lora-mode",
        choices=("auto", "runtime", "merge"),
        default="auto",
        help="fine-tuned models: LoRA loaded at run time (auto on GPU) or merged into the "
        "weights and served by a vLLM process each (auto on CPU)",
    )
    vllm.add_argument(
        "--vllm-max-running",
        type=int,
        default=1,
        help="merge mode: vLLM processes at once (ports --vllm-port, +1, ...)",
    )
    vllm.add_argument(
        "--vllm-switch",
        choices=("reload", "restart"),
        default="reload",
        help="merge mode: another checkpoint's weights are loaded into a running vLLM in place, "
        "or vLLM is restarted on it",
    )
    vllm.add_argument(
        "--vllm-serve-during-training",
        action="store_true",
        help="keep vLLM running while a fine-tuning job trains (default: stopped to free the GPU "
        "or the RAM, restarted after the job)",
    )


def _add_vllm_cpu_arguments(parser: argparse.ArgumentParser) -> None:
    """The settings of vllm-cpu, which serves the 2-core machines (docs/serving.md)."""
    vllm = parser.add_argument_group("vllm engine on CPU (vllm-cpu)")
    vllm.add_argument(
        "--vllm-cpu-kv-cache-mib",
        type=int,
        default=None,
        help="CPU: KV cache per vLLM process (default 512 MiB in bf16, 1,024 in fp32)",
    )
    vllm.add_argument(
        "--vllm-cpu-max-num-seqs",
        type=_positive,
        default=CPU_MAX_NUM_SEQS,
        help=f"CPU: sequences vLLM runs at once (default {CPU_MAX_NUM_SEQS}); the rest wait in "
        "its queue",
    )
    vllm.add_argument(
        "--vllm-cpu-block-size",
        type=_positive,
        default=CPU_BLOCK_SIZE,
        help=f"CPU: tokens per KV-cache block, a multiple of 32 (default {CPU_BLOCK_SIZE}; "
        "vLLM's own is 128); the prefix cache shares whole blocks only",
    )
    vllm.add_argument(
        "--vllm-cpu-dtype",
        choices=CPU_DTYPES,
        default="auto",
        help="CPU: vLLM's dtype (auto: bf16 where the CPU computes it natively, else fp32)",
    )


def vllm_options(args: argparse.Namespace) -> dict:
    """The vLLM engine's options from the command line."""
    return {
        "port": args.vllm_port,
        "host": args.host,
        "tensor_parallel_size": args.vllm_tensor_parallel_size,
        "data_parallel_size": args.vllm_data_parallel_size,
        "gpu_memory_utilization": args.vllm_gpu_memory_utilization,
        "max_model_len": args.vllm_max_model_len,
        "max_loras": args.vllm_max_loras,
        "max_lora_rank": args.vllm_max_lora_rank,
        "enforce_eager": args.vllm_enforce_eager,
        "cpu_dtype": args.vllm_cpu_dtype,
        "cpu_max_num_seqs": args.vllm_cpu_max_num_seqs,
        "cpu_block_size": args.vllm_cpu_block_size,
    }


def vllm_engine_options(args: argparse.Namespace, state_dir: Path) -> dict:
    """The vLLM engine's own options (beyond `vllm serve`'s): device, LoRA mode, processes."""
    return {
        "device": args.vllm_device,
        "lora_mode": args.vllm_lora_mode,
        "max_running": args.vllm_max_running,
        "weight_reload": args.vllm_switch == "reload",
        "serve_during_training": args.vllm_serve_during_training,
        "cpu_kv_cache_mib": args.vllm_cpu_kv_cache_mib,
        "merge_dir": state_dir / "vllm-merged",
        "log_path": state_dir / f"vllm-{args.vllm_port}.log",
    }


def _model_and_name(model: str | None) -> tuple[str, str | None]:
    """The model to load and, for the embedded default, its public name."""
    if model:
        return model, None
    from nip_core.lm_server.embedded_model import EMBEDDED_MODEL_NAME, embedded_model_path

    return str(embedded_model_path()), EMBEDDED_MODEL_NAME


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    from nip_core.lm_server.app import create_app
    from nip_core.lm_server.embedded_model import cache_root
    from nip_core.lm_server.model_check import UnsupportedModelError, check_chat_model

    args = _parse(argv)
    token = os.environ.get("NIP_LM_SERVER_TOKEN") or None
    if args.host not in LOOPBACK and token is None and not args.insecure_no_token:
        raise SystemExit(
            f"error: serving on {args.host} needs a token: set NIP_LM_SERVER_TOKEN (clients send "
            "it as the bearer token), or pass --insecure-no-token"
        )
    logging.basicConfig(
        level=os.environ.get("NIP_LM_SERVER_LOG_LEVEL", "WARNING").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.engine == "dummy" and not args.model:
        from nip_core.lm_server.embedded_model import EMBEDDED_MODEL_NAME

        model, public_name = EMBEDDED_MODEL_NAME, None  # canned answers need no weights
    else:
        model, public_name = _model_and_name(args.model)
        try:
            check_chat_model(model, config_required=args.engine != "vllm")
        except UnsupportedModelError as error:
            raise SystemExit(f"error: {error}") from None
    state_dir = Path(args.state_dir) if args.state_dir else cache_root() / "lm-server-state"
    opts = {}
    if args.engine == "vllm":
        opts = vllm_options(args) | vllm_engine_options(args, state_dir)
    elif args.engine == "transformers":
        opts = hf_options(args)
    engine = make_engine(args.engine, model, **opts)
    app = create_app(
        engine,
        state_dir,
        token,
        base_name=public_name,
        owner=args.owner,
        fake_seconds=args.fake_train_seconds,
        train_processes=args.train_processes,
        deepspeed_config=args.train_deepspeed_config,
        max_training_restarts=args.max_training_restarts,
        allow_any_adapter_path=args.allow_adapters_anywhere,
    )
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level="warning",
        timeout_keep_alive=KEEP_ALIVE_SECONDS,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
    )


if __name__ == "__main__":
    main()
