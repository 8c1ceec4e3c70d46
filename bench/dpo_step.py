"""Benchmark: one DPO optimisation step on CPU relative to a plain forward+backward.

    python bench/dpo_step.py [--steps 8] [--tokens 100] [--answer-words N]
    python bench/dpo_step.py --tokens 500 --answer-words 2 --compare-shared-prompt
    python bench/dpo_step.py --tokens 470 --answer-words 6 --compare-lora-top-layers 10
    python bench/dpo_step.py --tokens 470 --answer-words 10 --compare-prompt-gradients
    python bench/dpo_step.py --tokens 385 --answer-words 6 --compare-lean-lora --precision bf16
    python bench/dpo_step.py --steps 12 --tokens 385 --answer-words 9 --compare-packed-pairs

Loads the embedded SmolLM2-135M-Instruct (`--precision`), builds TRL's `DPOTrainer` through the
same code the server's training child uses (`nip_core.lm_server.training`, LoRA on all linear
layers, batch 2 pairs of ~`--tokens` tokens each, two epochs), and times whole optimisation steps
(data collation and optimizer included; model loading, tokenisation and the reference's
log-probabilities, which a job of several epochs computes once before the first step,
excluded) between consecutive step-end callbacks. The baseline is a plain fp32
forward+backward (all weights trainable) of the same 4 sequences, run between the steps so
both see the same machine load; the ratio uses the fastest of each. The last line is `ratio dpo_step/forward_backward: <x>`.

`--compare-shared-prompt` times the same steps twice, the pair's common prompt run once
(`nip_core.lm_server.shared_prefix`, the default) and duplicated in both rows (TRL's own
batch), and ends with `ratio shared_prompt/duplicated_prompt: <x>` (fastest steps). With
`--answer-words 2` the pairs look like the verifier's label pairs: a long prompt, a short answer.
`--compare-lora-top-layers N` times LoRA on every layer, then on the last N only
(`lora_top_layers`), and ends with `ratio top_N_layers/all_layers: <x>` (fastest steps).
`--compare-prompt-gradients` times the shared prompt trained, then run without gradients
(`prompt_gradients` false), and ends with `ratio frozen_prompt/trained_prompt: <x>`.
`--compare-lean-lora` times PEFT's own LoRA forward, then ours (`nip_core.lm_server.lean_lora`,
the default), and ends with `ratio lean_lora/peft_lora: <x>`; `--precision fp32|bf16` sets the
frozen weights' type (default: auto, bf16 where the CPU multiplies it natively).
`--compare-packed-pairs` times each pair's answers run after its prompt through the prompt's
cache (two backbone calls a step), then each pair packed in one row (one call, the default),
alternating twice (the VM's speed drifts), and ends with `ratio packed/cached: <x>` (median
steps over both rounds of each).
`--compare-compiled-layers` times eager steps, then each decoder layer under `torch.compile`
(`dynamic=True`; the steps it compiles in are left in), and ends with
`ratio compiled/eager: <x>` (median steps of each run's second half).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
from transformers import TrainerCallback

from nip_core.lm_server import training
from nip_core.lm_server.embedded_model import embedded_model_path
from nip_core.lm_server.options import TrainingOptions


class PairedClock(TrainerCallback):
    """Times every optimisation step and, between steps, one plain forward+backward.

    The machine may be shared, so both measurements are interleaved: each baseline run happens
    right after a DPO step, under the same load, and its time is cut out of the step intervals.
    """

    def __init__(self, baseline) -> None:
        self.baseline = baseline
        self.steps: list[float] = []
        self.plain: list[float] = []
        self._resumed: float | None = None

    def on_step_end(self, args, state, control, **kwargs):
        now = time.perf_counter()
        if self._resumed is not None:
            self.steps.append(now - self._resumed)
        self.plain.append(self.baseline())
        self._resumed = time.perf_counter()


def _words(count: int, offset: int) -> str:
    vocab = "code test input output value list loop return check case bound error".split()
    return " ".join(vocab[(offset + i * 7) % len(vocab)] for i in range(count))


def make_pairs(count: int, tokenizer, tokens: int, answer_words: int | None = None) -> list[dict]:
    """`count` preference pairs whose prompt + answer is about `tokens` tokens long: a prompt
    of a third of them by default, or answers of `answer_words` words and the prompt the rest."""
    rows = []
    for i in range(count):
        # ~40 tokens of the chat template's system prompt and turn markers around the words
        prompt_words = tokens // 3 if answer_words is None else max(1, tokens - answer_words - 40)
        prompt = [{"role": "user", "content": _words(prompt_words, i)}]
        text = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
        prompt_len = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        words = answer_words
        if words is None:  # per pair, from its own prompt's length
            words = max(4, tokens - prompt_len - 2)  # the end-of-turn tokens
        rows.append(
            {
                "prompt": prompt,
                "chosen": [{"role": "assistant", "content": _words(words, i + 1)}],
                "rejected": [{"role": "assistant", "content": _words(words, i + 2)}],
            }
        )
    return rows


def first_batch(trainer) -> list[list[int]]:
    """Token ids of the 4 sequences (2 chosen, 2 rejected) of the first training batch."""
    first = trainer.train_dataset[:2]
    pairs = zip(first["prompt_ids"], first["chosen_ids"], first["rejected_ids"], strict=True)
    chosen, rejected = zip(*[(p + c, p + r) for p, c, r in pairs], strict=True)
    return [*chosen, *rejected]


def plain_forward_backward(model_path: str, sequences: list[list[int]]):
    """A function timing one fp32 forward+backward (all weights trainable) of `sequences`."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).train()
    width = max(len(s) for s in sequences)
    ids = torch.tensor([s + [0] * (width - len(s)) for s in sequences])
    mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in sequences])
    labels = ids.masked_fill(mask == 0, -100)

    def run() -> float:
        start = time.perf_counter()
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
        elapsed = time.perf_counter() - start
        model.zero_grad(set_to_none=True)
        return elapsed

    run()  # warm-up
    return run


def measure(
    model_path: str,
    steps: int,
    tokens: int,
    lora_dropout: float,
    answer_words: int | None = None,
    checkpointing: bool | None = None,
    lora_top_layers: int | None = None,
    prompt_gradients: bool = True,
    precision: str = "auto",
) -> tuple[PairedClock, list[int]]:
    """Train `steps` DPO steps through the server's code path with interleaved baselines."""
    options = TrainingOptions(
        method="dpo",
        batch_size=2,
        n_epochs=2,
        learning_rate=1e-5,
        lora_dropout=lora_dropout,
        activation_checkpointing=checkpointing,
        lora_top_layers=lora_top_layers,
        prompt_gradients=prompt_gradients,
        precision=precision,
    )
    tokenizer = training.load_tokenizer(model_path)
    # 2 epochs of steps / 2, as jobs of several epochs
    rows = make_pairs(steps, tokenizer, tokens, answer_words)
    model, peft_config, _ = training.load_for_training(model_path, None, options)
    with tempfile.TemporaryDirectory() as out:
        trainer = training.build_trainer(options, model, tokenizer, rows, out, peft_config)
        sequences = first_batch(trainer)
        clock = PairedClock(plain_forward_backward(model_path, sequences))
        trainer.add_callback(clock)
        trainer.train()
    return clock, [len(s) for s in sequences]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=100)
    parser.add_argument("--threads", type=int, default=2)
    # 0 lets TRL switch dropout off (its DPO default): no random masks, policy matches reference.
    parser.add_argument("--lora-dropout", type=float, default=0.0)
    parser.add_argument("--answer-words", type=int, default=None)
    parser.add_argument("--compare-shared-prompt", action="store_true")
    parser.add_argument("--compare-lora-top-layers", type=int, default=None, metavar="N")
    parser.add_argument("--compare-prompt-gradients", action="store_true")
    parser.add_argument("--compare-lean-lora", action="store_true")
    parser.add_argument("--compare-compiled-layers", action="store_true")
    parser.add_argument("--compare-packed-pairs", action="store_true")
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    run = (
        str(embedded_model_path()),
        args.steps,
        args.tokens,
        args.lora_dropout,
        args.answer_words,
    )
    if args.compare_shared_prompt:
        compare_shared_prompt(run)
        return
    if args.compare_lora_top_layers:
        compare_lora_top_layers(run, args.compare_lora_top_layers)
        return
    if args.compare_prompt_gradients:
        compare_prompt_gradients(run)
        return
    if args.compare_lean_lora:
        compare_lean_lora(run, args.precision)
        return
    if args.compare_compiled_layers:
        compare_compiled_layers(run, args.precision)
        return
    if args.compare_packed_pairs:
        compare_packed_pairs(run, args.precision)
        return
    clock, lengths = measure(*run, precision=args.precision)
    mean_step = statistics.mean(clock.steps)
    step, plain = statistics.median(clock.steps), statistics.median(clock.plain)
    best_step, best_plain = min(clock.steps), min(clock.plain)
    print(f"sequence lengths: {lengths}; steps timed: {len(clock.steps)}")
    print("dpo steps (s): " + " ".join(f"{t:.2f}" for t in clock.steps))
    print("forward+backward (s): " + " ".join(f"{t:.2f}" for t in clock.plain))
    print(f"mean dpo step {mean_step:.2f} s; medians: dpo {step:.2f} s, fwd+bwd {plain:.2f} s")
    print(f"median ratio (sensitive to other load on the machine): {step / plain:.2f}")
    # Minima, as timeit recommends: on a shared machine the fastest run is the least disturbed.
    print(f"ratio dpo_step/forward_backward: {best_step / best_plain:.2f}")


def timed_variant(run: tuple, label: str, **options) -> float:
    """Time `run`'s steps with `options` on the experiment configs' path (the prompt run once,
    no activation checkpointing), print them under `label`; the fastest step."""
    clock, lengths = measure(*run, checkpointing=False, **options)
    steps = " ".join(f"{t:.2f}" for t in clock.steps)
    print(f"{label}: sequence lengths {lengths}; dpo steps (s): {steps}")
    return min(clock.steps)


def compare_shared_prompt(run: tuple) -> None:
    """The same steps with the pair's prompt duplicated (TRL's batch), then run once."""
    fastest = {}
    for shared in (False, True):
        training.SHARE_PAIR_PROMPTS = shared
        # The prompt is shared only without activation checkpointing (which runs without a
        # cache), as the experiment configs train (`training_activation_checkpointing: false`).
        name = "shared" if shared else "duplicated"
        fastest[name] = timed_variant(run, f"{name} prompt")
    print(f"ratio shared_prompt/duplicated_prompt: {fastest['shared'] / fastest['duplicated']:.2f}")


def compare_lora_top_layers(run: tuple, count: int) -> None:
    """The same steps with LoRA on every layer, then on the last `count` only."""
    fastest = {}
    for top in (None, count):
        name = "all layers" if top is None else f"top {top} layers"
        fastest[top] = timed_variant(run, f"LoRA on {name}", lora_top_layers=top)
    print(f"ratio top_{count}_layers/all_layers: {fastest[count] / fastest[None]:.2f}")


def compare_prompt_gradients(run: tuple) -> None:
    """The same steps with the shared prompt trained, then run without gradients."""
    fastest = {}
    for prompt_gradients in (True, False):
        name = "trained" if prompt_gradients else "frozen"
        fastest[name] = timed_variant(run, f"{name} prompt", prompt_gradients=prompt_gradients)
    print(f"ratio frozen_prompt/trained_prompt: {fastest['frozen'] / fastest['trained']:.2f}")


def compare_lean_lora(run: tuple, precision: str) -> None:
    """The same steps with PEFT's LoRA forward, then the lean one (the server's default)."""
    fastest = {}
    for lean in (False, True):
        training.LEAN_LORA_FORWARD = lean
        name = "lean" if lean else "peft"
        fastest[name] = timed_variant(run, f"{name} LoRA ({precision})", precision=precision)
    print(f"ratio lean_lora/peft_lora: {fastest['lean'] / fastest['peft']:.2f}")


def compare_packed_pairs(run: tuple, precision: str) -> None:
    """The same steps with each pair's answers through its prompt's cache, then packed in one
    row with its prompt, twice over."""
    steps = {"cached": [], "packed": []}
    for _ in range(2):
        for packed in (False, True):
            training.PACK_PAIR_ANSWERS = packed
            name = "packed" if packed else "cached"
            clock, lengths = measure(*run, checkpointing=False, precision=precision)
            steps[name] += clock.steps
            timed = " ".join(f"{t:.2f}" for t in clock.steps)
            print(f"{name} pairs ({precision}): sequence lengths {lengths}; dpo steps (s): {timed}")
    medians = {name: statistics.median(times) for name, times in steps.items()}
    print(f"median steps: cached {medians['cached']:.2f} s, packed {medians['packed']:.2f} s")
    print(f"ratio packed/cached: {medians['packed'] / medians['cached']:.2f}")


def compare_compiled_layers(run: tuple, precision: str) -> None:
    """The same steps eager, then with every decoder layer compiled after the trainer is built."""
    from nip_core.lm_server.shared_prefix import transformer_backbone

    build = training.build_trainer

    def build_compiled(*args, **kwargs):
        trainer = build(*args, **kwargs)
        for layer in transformer_backbone(trainer.model).layers:
            layer.compile(dynamic=True)
        return trainer

    later = {}
    for compiled in (False, True):
        training.build_trainer = build_compiled if compiled else build
        try:
            clock, lengths = measure(*run, checkpointing=False, precision=precision)
        finally:
            training.build_trainer = build
        name = "compiled" if compiled else "eager"
        steps = " ".join(f"{t:.2f}" for t in clock.steps)
        print(f"{name} layers ({precision}): sequence lengths {lengths}; dpo steps (s): {steps}")
        later[name] = statistics.median(clock.steps[len(clock.steps) // 2 :])
    print(f"ratio compiled/eager: {later['compiled'] / later['eager']:.2f}")


if __name__ == "__main__":
    main()
