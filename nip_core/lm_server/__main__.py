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


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m nip_core.lm_server", description=__doc__)
    parser.add_argument("--engine", choices=ENGINE_NAMES, default="transformers")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--model", help="model path or name (default: embedded SmolLM2)")
    parser.add_argument("--state-dir", help="where files, jobs and adapters are kept")
    parser.add_argument(
        "--fake-train-seconds",
        type=float,
        default=0.0,
        help="dummy engine only: how long each fake training job takes",
    )
    parser.add_argument("--vllm-port", type=int, default=8001, help="port of the vLLM child")
    return parser.parse_args(argv)


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

    args = _parse(argv)
    logging.basicConfig(
        level=os.environ.get("NIP_LM_SERVER_LOG_LEVEL", "WARNING").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.engine == "dummy" and not args.model:
        from nip_core.lm_server.embedded_model import EMBEDDED_MODEL_NAME

        model, public_name = EMBEDDED_MODEL_NAME, None  # canned answers need no weights
    else:
        model, public_name = _model_and_name(args.model)
    opts = {"port": args.vllm_port, "host": args.host} if args.engine == "vllm" else {}
    engine = make_engine(args.engine, model, **opts)
    state_dir = Path(args.state_dir) if args.state_dir else cache_root() / "lm-server-state"
    token = os.environ.get("NIP_LM_SERVER_TOKEN") or None
    app = create_app(
        engine, state_dir, token, base_name=public_name, fake_seconds=args.fake_train_seconds
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
