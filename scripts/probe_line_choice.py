"""Where does the frozen model's relative trace of a bug survive? Three readings of one contrast.

The medium grade's correct solution and its buggy twin differ in one block of lines. For each
question of a split (`--split`, `--seed`, `--difficulty`) this scores, with the embedded
SmolLM2-135M-Instruct and no sampling, which of the two blocks the model prefers:

- `code`: plain text, no chat: the question and the solution up to the block, then each block
  with the rest of the solution after it; the log-probability of that continuation, summed and
  per token (the likelihood baseline made local to where the twins differ).
- `chat_write`: a chat whose user turn asks for the function and whose assistant turn writes
  it: the same continuation scored inside the assistant's reply (does the chat format keep it?).
- `chat_fill`: the solution shown with the block cut out, "Write the missing part only.", no
  version listed; the log-probability of the assistant writing each version (a verifier that
  judges by filling the gap: its reading needs no order).
- `chat_choose`: the solution shown with the block cut out, both versions listed ("Version 1",
  "Version 2", each order once), "Which version makes the function correct? Write that version
  only."; the log-probability of the assistant copying each version (a verifier that judges by
  writing its choice).

Each reading's paired accuracy: the share of questions whose correct block scores higher (ties
one half; `chat_choose` averaged over both orders, and per order). Prints one JSON line per
question and the summary last; `--out` keeps both.

    python scripts/probe_line_choice.py --out docs/results/probe-line-choice/validation-7002.json
"""

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from nip_core.data.pairwise import changed_line_blocks  # noqa: E402
from nip_core.data.splits import load_split  # noqa: E402
from nip_core.experiment.probe import paired_accuracy  # noqa: E402
from nip_core.lm_server.embedded_model import embedded_model_path  # noqa: E402
from nip_core.parameters import HyperParameters  # noqa: E402
from nip_core.parameters.loading import read_params_file  # noqa: E402

CUT = "    # <the missing part>"


def changed_block(good: str, bad: str) -> tuple[list[str], list[str], list[str], list[str]] | None:
    """(lines before, correct block, buggy block, lines after) where two solutions differ in one
    block of lines; None where they differ in more than one."""
    changes = changed_line_blocks(good, bad)
    if len(changes) != 1:
        return None
    (a0, a1, b0, b1), good_lines, bad_lines = changes[0], good.splitlines(), bad.splitlines()
    return good_lines[:a0], good_lines[a0:a1], bad_lines[b0:b1], good_lines[a1:]


class Scorer:
    def __init__(self, threads: int):
        torch.set_num_threads(threads)
        path = embedded_model_path()
        self.tok = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()

    def ids(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def chat_prefix(self, user: str, reply_start: str = "") -> list[int]:
        chat = [{"role": "user", "content": user}]
        text = self.tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        return self.ids(text + reply_start)

    @torch.no_grad()
    def continuation(self, prefix: list[int], text: str) -> tuple[float, float]:
        """(summed, per-token) log-probability of `text` after the token ids `prefix`."""
        tail = self.ids(text)
        ids = torch.tensor([prefix + tail])
        logp = torch.log_softmax(self.model(ids).logits[0, :-1].float(), -1)
        own = logp.gather(1, ids[0, 1:, None])[:, 0][len(prefix) - 1 :]
        return float(own.sum()), float(own.mean())


def question_scores(scorer: Scorer, question: str, good: str, bad: str) -> dict | None:
    parts = changed_block(good, bad)
    if parts is None:
        return None
    before, good_block, bad_block, after = parts
    head = "\n".join(before) + "\n" if before else ""
    out = {}
    code_prefix = scorer.ids(question.rstrip("\n") + "\n" + head)
    write_prefix = scorer.chat_prefix(
        question + "\n\nWrite the function in Python.", "```python\n" + head
    )
    for name, block in (("good", good_block), ("bad", bad_block)):
        rest = "\n".join(block + after) + "\n"
        out[f"code_sum_{name}"], out[f"code_mean_{name}"] = scorer.continuation(code_prefix, rest)
        out[f"chat_write_sum_{name}"], out[f"chat_write_mean_{name}"] = scorer.continuation(
            write_prefix, rest + "```"
        )
    shown = {
        "good": "\n".join(good_block) or "(nothing)",
        "bad": "\n".join(bad_block) or "(nothing)",
    }
    masked = "\n".join([*before, CUT, *after])
    fill_prefix = scorer.chat_prefix(
        f"{question}\n\nHere is a solution with one part missing:\n```python\n{masked}\n```\n\n"
        "Write the missing part only."
    )
    for name in ("good", "bad"):
        out[f"chat_fill_sum_{name}"], out[f"chat_fill_mean_{name}"] = scorer.continuation(
            fill_prefix, f"```python\n{shown[name]}\n```"
        )
    for order, (first, second) in enumerate((("good", "bad"), ("bad", "good"))):
        user = (
            f"{question}\n\nHere is a solution with one part missing:\n```python\n{masked}\n```\n\n"
            f"Version 1 of the missing part:\n```python\n{shown[first]}\n```\n"
            f"Version 2 of the missing part:\n```python\n{shown[second]}\n```\n\n"
            "Which version makes the function correct? Write that version only."
        )
        prefix = scorer.chat_prefix(user)
        for name in ("good", "bad"):
            total, mean = scorer.continuation(prefix, f"```python\n{shown[name]}\n```")
            out[f"chat_choose{order}_sum_{name}"], out[f"chat_choose{order}_mean_{name}"] = (
                total,
                mean,
            )
    return out


def paired(rows: list[dict], reading: str) -> float:
    """The share of questions whose correct block scores higher under `reading` (ties half)."""
    good = [r[f"{reading}_good"] for r in rows]
    bad = [r[f"{reading}_bad"] for r in rows]
    questions = list(range(len(rows)))
    return paired_accuracy(
        np.array(good + bad), np.array([1] * len(rows) + [0] * len(rows)), questions + questions
    )


def summary(rows: list[dict]) -> dict:
    out = {"questions": len(rows)}
    for kind in ("sum", "mean"):
        for reading in ("code", "chat_write", "chat_fill"):
            out[f"{reading}_{kind}"] = paired(rows, f"{reading}_{kind}")
        by_order = [paired(rows, f"chat_choose{order}_{kind}") for order in (0, 1)]
        out[f"chat_choose_{kind}"] = float(np.mean(by_order))
        out[f"chat_choose_{kind}_correct_first"], out[f"chat_choose_{kind}_correct_second"] = (
            by_order
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", default="validation", choices=("train", "validation", "test"))
    parser.add_argument("--seed", type=int, default=7002)
    parser.add_argument("--difficulty", default="medium")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    data = read_params_file(REPO / "configs" / "experiment-cpu-easy.yaml")
    data.pop("experiment", None)
    data["seed"] = args.seed
    data["dataset_options"] = {"difficulty": args.difficulty, "solution_docstring": "dropped"}
    frame = load_split(HyperParameters.from_dict(data), args.split)
    frame = frame.assign(problem=frame["id"] // 1000)
    scorer, rows, skipped, start = Scorer(args.threads), [], 0, time.monotonic()
    for problem, twins in frame.groupby("problem"):
        good, bad = twins[twins["y"] == 1], twins[twins["y"] == 0]
        if good.empty or bad.empty:
            continue
        scores = question_scores(
            scorer, good["question"].iloc[0], good["solution"].iloc[0], bad["solution"].iloc[0]
        )
        if scores is None:
            skipped += 1
            continue
        rows.append({"problem": int(problem), **scores})
        print(json.dumps(rows[-1]), flush=True)
    result = {
        "split": args.split,
        "seed": args.seed,
        "difficulty": args.difficulty,
        "skipped_more_than_one_block": skipped,
        "seconds": round(time.monotonic() - start, 1),
        **summary(rows),
    }
    print(json.dumps(result), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"summary": result, "questions": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
