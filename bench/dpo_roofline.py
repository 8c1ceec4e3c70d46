"""Benchmark: a DPO step of the shipped recipe against the same machine's matrix-multiply rate.

    python bench/dpo_roofline.py                        # 16 pairs of the recipe, 2 epochs
    python bench/dpo_roofline.py --pairs 8 --epochs 1   # a quick look
    python bench/dpo_roofline.py --compare agents._default.lora_dropout=0.05   # an older recipe first

The path users run: `python -m nip_core.lm_server --engine transformers` as a child process, the
real `openai` SDK uploading the recipe's own pairs and creating a DPO job with the options the
experiment sends (`configs/experiment-cpu-easy.yaml`, its `malt` arm: LoRA rank 16 on every
layer, both pairs of a step in one batch, its learning rate, RPO, the file's order, no activation
checkpointing), and the training child timing every step (`step_seconds` in its events). The
pairs are the verifier's own sampled replies that the recipe trained on in its second iteration
(`docs/results/short-solution-acceptance/seeds/6198/pairs/`, the first `--pairs`). Another
recipe's step: `--config` and `--pairs-file`, e.g. the fill-in protocol's
(`configs/experiment-cpu-fill-in-choice.yaml`,
`docs/results/mixed-fill-in-choice/pairs/seed-7304-iteration-1-dpo-verifier.parquet`).

For each step it counts the work the step must do from the model's shapes and the tokens of its
pairs (`nip_core.lm_server.step_flops`: projections, LoRA, attention and the output layer at
the answers' positions, forward and backward) and divides by the step's time: the achieved rate.
The reference is the fastest rate a plain matrix multiply of the same shapes (each projection
and its backward at the step's tokens, all cores) reaches on this machine in any precision the
step may use: fp32, and bf16 where the hardware has it natively (a CPU listing AVX512_BF16 or
AMX, a CUDA GPU), read before and after the job (the VM's speed drifts by up to a third within
minutes; the faster reading counts). The first step (warm-up) is left out; the rate is the
summed work over the summed time of the others. The last line is `ratio achieved/matmul: <x>`.

`--compare KEY=VALUE` (repeatable, the config's dotted keys) runs the job twice on the same
server, first with those settings (e.g. the recipe as it was, or
`agents._default.training_precision=fp32` against `auto` on a CPU with native bf16), then as the
config ships, and prints both ratios; the last line is the shipped recipe's.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_generation import ROOT, _free_port, _wait_up  # noqa: E402

from nip_core.lm_server import training  # noqa: E402
from nip_core.lm_server.embedded_model import EMBEDDED_MODEL_NAME, embedded_model_path  # noqa: E402
from nip_core.lm_server.hardware import NATIVE_BF16_FLAGS, cpu_flags  # noqa: E402
from nip_core.lm_server.precision import has_cuda  # noqa: E402
from nip_core.lm_server.step_flops import ModelShapes, dpo_step_work  # noqa: E402
from nip_core.parameters import HyperParameters  # noqa: E402
from nip_core.parameters.loading import apply_overrides, read_params_file  # noqa: E402
from nip_core.training.fine_tune_jobs import lora_training_options  # noqa: E402
from nip_core.training.job_diagnostics import step_seconds  # noqa: E402

RECIPE = ROOT / "configs" / "experiment-cpu-easy.yaml"
PAIRS = (
    ROOT
    / "docs/results/short-solution-acceptance/seeds/6198/pairs/malt-iteration-1-dpo-verifier.parquet"
)


def recipe_request(
    config: Path, epochs: int | None, overrides: list[str] = ()
) -> tuple[dict, dict]:
    """(the DPO method block, our `nip_training` extension) the experiment sends for the
    verifier of `config`'s base arm, with dotted `overrides` ("key=value")."""
    data = read_params_file(config)
    data.pop("experiment", None)
    hp = apply_overrides(HyperParameters.from_dict(data), list(overrides))
    params = hp.agents["verifier"] if "verifier" in hp.agents else hp.agents["_default"]
    hyper = {
        "n_epochs": epochs or params.num_epochs,
        "batch_size": params.per_device_train_batch_size,
    }
    if params.dpo_beta is not None:
        hyper["beta"] = params.dpo_beta
    alpha = params.effective_lora_alpha
    extension = lora_training_options(params, alpha, hp.rl.learning_rate, "dpo")
    return {"type": "dpo", "dpo": {"hyperparameters": hyper}}, extension


def recipe_pairs(count: int, path: Path = PAIRS) -> list[dict]:
    """The first `count` of the recipe's pairs (an exported DPO Parquet) as fine-tuning API rows."""
    frame = pd.read_parquet(path).head(count)
    return [
        {
            "input": {"messages": [dict(m) for m in row.prompt]},
            "preferred_output": [dict(m) for m in row.chosen],
            "non_preferred_output": [dict(m) for m in row.rejected],
        }
        for row in frame.itertuples()
    ]


def pair_tokens(tokenizer, rows: list[dict]) -> list[tuple[int, int, int]]:
    """(prompt, chosen, rejected) token counts as TRL builds a conversational pair: the prompt
    through the chat template with the generation prompt, each answer what the whole
    conversation adds to it."""

    def ids(messages: list[dict], generation: bool = False) -> list[int]:
        return tokenizer.apply_chat_template(
            messages, add_generation_prompt=generation, tokenize=True, return_dict=False
        )

    counts = []
    for row in rows:
        prompt = row["input"]["messages"]
        start = len(ids(prompt, generation=True))
        chosen = len(ids(prompt + row["preferred_output"])) - start
        rejected = len(ids(prompt + row["non_preferred_output"])) - start
        counts.append((start, chosen, rejected))
    return counts


def step_pairs(
    tokens: list[tuple[int, int, int]], per_step: int, steps: int
) -> list[list[tuple[int, int, int]]]:
    """The pairs of each optimizer step when the file is trained in order, epoch after epoch."""
    per_epoch = -(-len(tokens) // per_step)
    out = []
    for step in range(steps):
        start = (step % per_epoch) * per_step
        out.append(tokens[start : start + per_step])
    return out


def matmul_rate(shapes: ModelShapes, tokens: int, dtype, device: str, repeats: int = 5) -> float:
    """FLOP/s of the step's matrix products done plainly: every projection of a layer forward
    (x @ W) and backward (g @ W^T) at `tokens` rows, the fastest of `repeats` rounds."""
    import torch

    pairs = []
    for fan_in, fan_out in shapes.projections():
        weight = torch.randn(fan_in, fan_out, dtype=dtype, device=device)
        pairs.append((torch.randn(tokens, fan_in, dtype=dtype, device=device), weight))
        pairs.append((torch.randn(tokens, fan_out, dtype=dtype, device=device), weight.T))
    flops = sum(2 * a.shape[0] * a.shape[1] * b.shape[1] for a, b in pairs)
    best = float("inf")
    for _ in range(repeats + 1):  # the first round warms up
        if device == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(10):
            for a, b in pairs:
                a @ b
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - started) / 10)
    return flops / best


def matmul_rates(shapes: ModelShapes, tokens: int, device: str) -> dict[str, float]:
    """`matmul_rate` in each precision this hardware multiplies natively, on all cores."""
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    return {
        name: matmul_rate(shapes, tokens, dtypes[name], device)
        for name in native_precisions(device)
    }


def native_precisions(device: str) -> list[str]:
    """The precisions the step may use that this hardware multiplies natively."""
    if device == "cuda":
        import torch

        return ["fp32", "bf16"] if torch.cuda.is_bf16_supported() else ["fp32", "fp16"]
    flags = cpu_flags() & NATIVE_BF16_FLAGS
    return ["fp32", "bf16"] if flags else ["fp32"]


def run_job(url: str, method: dict, extension: dict, rows: list[dict]) -> list[dict]:
    """Create the job, wait for it, and return its events oldest first."""
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    text = "".join(json.dumps(row) + "\n" for row in rows)
    upload = client.files.create(file=("dpo.jsonl", io.BytesIO(text.encode())), purpose="fine-tune")
    job = client.fine_tuning.jobs.create(
        model=EMBEDDED_MODEL_NAME,
        training_file=upload.id,
        method=method,
        suffix="roofline",
        seed=1,
        extra_body={"nip_training": extension},
    )
    while job.status not in ("succeeded", "failed", "cancelled"):
        time.sleep(1)
        job = client.fine_tuning.jobs.retrieve(job.id)
    if job.status != "succeeded":
        raise SystemExit(f"the job ended {job.status}: {job.error}")
    events = [e.model_dump() for e in client.fine_tuning.jobs.list_events(job.id, limit=10_000)]
    return sorted(events, key=lambda e: e["created_at"])


def measure(args, url: str, rows: list[dict], tokens, shapes, overrides: list[str]) -> float:
    """Run the recipe's job with `overrides`, print its figures; the ratio achieved/matmul."""
    method, extension = recipe_request(args.config, args.epochs, overrides)
    print(f"-- {' '.join(overrides) or 'the recipe as shipped'}")
    micro_tokens = round(statistics.mean(p + c + r for p, c, r in tokens))
    # The VM's speed drifts by up to a third within minutes: the cores' rate is read before and
    # after the job, and the faster reading is the denominator.
    before = matmul_rates(shapes, micro_tokens, "cuda" if has_cuda() else "cpu")
    events = run_job(url, method, extension, rows)
    first = next(e for e in events if e["message"].startswith("Training dpo"))
    used, device = first["data"]["precision"], first["data"]["device"].split(":")[0]
    seconds = step_seconds(events)
    per_step = (
        extension.get("gradient_accumulation_steps", 1)
        * method["dpo"]["hyperparameters"]["batch_size"]
    )
    work = [
        dpo_step_work(
            shapes,
            pairs,
            lora_rank=extension["lora_rank"],
            prompt_gradients=extension.get("prompt_gradients", True),
        )
        for pairs in step_pairs(tokens, per_step, len(seconds))
    ]
    timed = list(zip(work[1:], seconds[1:], strict=True)) or list(zip(work, seconds, strict=True))
    achieved = sum(w.total for w, _ in timed) / sum(s for _, s in timed)
    after = matmul_rates(shapes, micro_tokens, device)
    rates = {name: max(before.get(name, 0.0), rate) for name, rate in after.items()}
    best = max(rates, key=rates.get)
    print(f"{first['message']}")
    print(
        f"steps timed: {len(timed)} of {len(seconds)} (the first is warm-up); median "
        f"{statistics.median(s for _, s in timed):.2f} s, fastest {min(s for _, s in timed):.2f} s"
    )
    mean_work = statistics.mean(w.total for w, _ in timed)
    print(f"work per step: {mean_work / 1e9:.0f} GFLOP (forward and backward)")
    print(f"achieved: {achieved / 1e9:.1f} GFLOP/s with frozen weights in {used}")
    shown = ", ".join(
        f"{name} {rate / 1e9:.1f} GFLOP/s (before {before.get(name, 0.0) / 1e9:.0f}, after "
        f"{after[name] / 1e9:.0f})"
        for name, rate in rates.items()
    )
    print(f"matmul on the model's shapes ({micro_tokens} rows, all cores): {shown}")
    ratio = achieved / rates[best]
    print(f"{used} step: ratio achieved/matmul ({best}): {ratio:.2f}")
    return ratio


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=2, help="0: the recipe's own")
    parser.add_argument("--config", type=Path, default=RECIPE)
    parser.add_argument("--compare", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument(
        "--pairs-file", type=Path, default=PAIRS, help="an exported DPO Parquet of the recipe"
    )
    args = parser.parse_args(argv)
    args.config = args.config.resolve()
    from transformers import AutoConfig

    model_path = embedded_model_path()
    shapes = ModelShapes.from_config(AutoConfig.from_pretrained(model_path))
    rows = recipe_pairs(args.pairs, args.pairs_file.resolve())
    tokens = pair_tokens(training.load_tokenizer(str(model_path)), rows)
    prompt, answers = zip(*[(p, c + r) for p, c, r in tokens], strict=True)
    print(
        f"recipe: {args.config.relative_to(ROOT)}; {len(rows)} of its pairs "
        f"({args.pairs_file}): prompt {statistics.mean(prompt):.0f} tokens, answers "
        f"{statistics.mean(answers) / 2:.1f}, on average"
    )
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as state:
        env = dict(os.environ, PYTHONPATH=str(ROOT), TOKENIZERS_PARALLELISM="false")
        command = [sys.executable, "-m", "nip_core.lm_server", "--engine", "transformers"]
        command += ["--port", str(port), "--state-dir", state]
        proc = subprocess.Popen(command, env=env)
        try:
            _wait_up(url, proc, 600)
            before = (
                measure(args, url, rows, tokens, shapes, args.compare) if args.compare else None
            )
            shipped = measure(args, url, rows, tokens, shapes, [])
        finally:
            proc.terminate()
            proc.wait(timeout=120)
    if before is not None:
        print(f"ratio with {' '.join(args.compare)}: {before:.2f}; as shipped: {shipped:.2f}")
    print(f"ratio achieved/matmul: {shipped:.2f}")


if __name__ == "__main__":
    main()
