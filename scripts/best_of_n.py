"""Best-of-N by pairwise votes: pick the correct solution among a question's N candidates.

    python scripts/best_of_n.py --config configs/experiment-cpu-pairwise.yaml \\
        --adapter malt=artifacts/<experiment>/seeds/<seed>/base/lm_server/jobs/<job>/output \\
        --out docs/results/<folder>/best-of-n.json

The candidates of a test question are its distinct solutions in humaneval-buggy: the correct
one and the buggy ones of every grade (the easy stub, the medium, hard and mixed mutations),
3 to 5 per question, shown as the config shows solutions. Every ordered pair goes to the
verifier in the pairwise protocol's own prompt (`nip_core.agents.prompts`), and P(Solution A is
correct) is the softmax of its next-token log-probabilities of "accept" and "reject" after
"Decision:" (the experiments' verdict scores, one forward per ordered pair). Each candidate's
score sums its probability of being the correct one over both orders of every pair
(`nip_core.experiment.best_of_n`), and a question is solved when its top-ranked candidate is the
correct one. Beside each verifier (the frozen base model, and every `--adapter` on it): the
likelihood ranking (the candidate with the highest mean log-probability per token as the model's
reply to the question) and a random pick (1/N). Runs the model in this process (transformers,
PEFT for adapters) on the CPU or the GPU torch finds; prints one line per ranking and writes the
per-question picks to `--out`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from nip_core.agents import chat_messages  # noqa: E402
from nip_core.data.loaders import humaneval_file, shown_solutions  # noqa: E402
from nip_core.episode import Datapoint  # noqa: E402
from nip_core.experiment.best_of_n import ordered_pairs, round_robin_scores, share_solved  # noqa: E402
from nip_core.lm_server.embedded_model import embedded_model_path  # noqa: E402
from nip_core.model_api.chat_format import fold_speaker_names  # noqa: E402
from nip_core.parameters import HyperParameters  # noqa: E402
from nip_core.parameters.loading import read_params_file  # noqa: E402
from nip_core.protocols.build import make_protocol  # noqa: E402


def candidates(split: str, solution_docstring: str) -> list[dict]:
    """Per question of `split`: its question, distinct candidate solutions, and which is correct."""
    frame = pd.read_parquet(humaneval_file())
    frame = shown_solutions(frame[frame["split"] == split], solution_docstring)
    out = []
    for problem, rows in frame.groupby("problem_id", sort=True):
        correct = rows[rows["y"] == 1]["solution"].tolist()
        if len(correct) != 1:
            continue
        buggy = [s for s in dict.fromkeys(rows[rows["y"] == 0]["solution"]) if s != correct[0]]
        if not buggy:
            continue
        out.append(
            {
                "problem_id": problem,
                "question": rows["question"].iloc[0],
                "solutions": [correct[0], *buggy],
                "correct": 0,
            }
        )
    return out


def verdict_ids(tokenizer) -> tuple[int, int]:
    """The first token of " accept" and of " reject" after "Decision:"."""
    ids = [
        tokenizer.encode(f"Decision: {v}", add_special_tokens=False) for v in ("accept", "reject")
    ]
    prefix = len(tokenizer.encode("Decision:", add_special_tokens=False))
    return ids[0][prefix], ids[1][prefix]


@torch.no_grad()
def p_first(model, tokenizer, texts: list[str], accept: int, reject: int) -> list[float]:
    """P(accept) at the verdict of each prompt text (ending in "Decision:")."""
    out = []
    for text in texts:
        ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
        logits = model(input_ids=ids.to(model.device), logits_to_keep=1).logits[0, -1].float()
        out.append(float(torch.sigmoid(logits[accept] - logits[reject])))
    return out


@torch.no_grad()
def mean_logprob(model, tokenizer, question: str, solution: str) -> float:
    """Mean log-probability per token of `solution` as the model's reply to `question`."""
    chat = [{"role": "user", "content": question}]
    prefix = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    start = len(tokenizer(prefix, add_special_tokens=False)["input_ids"])
    ids = tokenizer(prefix + solution, return_tensors="pt", add_special_tokens=False)["input_ids"]
    logits = model(input_ids=ids.to(model.device)).logits[0, :-1].float()
    own = torch.log_softmax(logits, -1).gather(1, ids[0, 1:, None].to(model.device))[:, 0]
    return float(own[start - 1 :].mean())


def pairwise_texts(hp, tokenizer, question: str, solutions: list[str]) -> list[str]:
    """The verifier's prompt for every ordered pair, up to "Decision:"."""
    protocol, params = make_protocol(hp), hp.agents["_default"]
    texts = []
    for first, second in ordered_pairs(len(solutions)):
        point = Datapoint(0, question, solutions[first], 1, 1, other_solution=solutions[second])
        chat = fold_speaker_names(chat_messages(protocol, "verifier", params, point, [], 0, 0))
        texts.append(
            tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
            + "Decision:"
        )
    return texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--config", type=Path, default=REPO / "configs/experiment-cpu-pairwise.yaml"
    )
    parser.add_argument("--split", default="test")
    parser.add_argument("--adapter", action="append", default=[], metavar="NAME=DIR")
    parser.add_argument("--limit", type=int, default=None, help="the first N questions only")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    data = read_params_file(args.config)
    data.pop("experiment", None)
    data["interaction_protocol"] = "pairwise"
    hp = HyperParameters.from_dict(data)
    docstring = hp.dataset_options.solution_docstring
    questions = candidates(args.split, docstring)[: args.limit]
    path = str(embedded_model_path())
    tokenizer = AutoTokenizer.from_pretrained(path)
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    accept, reject = verdict_ids(tokenizer)
    sizes = [len(q["solutions"]) for q in questions]
    results = {
        "config": str(args.config),
        "split": args.split,
        "questions": len(questions),
        "candidates": sizes,
        "random": float(np.mean([1.0 / n for n in sizes])),
    }
    print(f"{len(questions)} questions, {np.mean(sizes):.2f} candidates each on average")
    print(f"random pick: {results['random']:.3f}")
    started = time.monotonic()
    likelihoods = [
        [mean_logprob(base, tokenizer, q["question"], s) for s in q["solutions"]] for q in questions
    ]
    index = [(i, q["correct"]) for i, q in enumerate(questions)]
    results["likelihood"] = share_solved(index, lambda i: likelihoods[i])
    print(f"likelihood per token: {results['likelihood']:.3f}")
    models = {"base": base}
    for spec in args.adapter:
        name, directory = spec.split("=", 1)
        from peft import PeftModel

        fresh = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        models[name] = PeftModel.from_pretrained(fresh, directory).eval()
    picks = {}
    for name, model in models.items():
        scores = []
        for q in questions:
            texts = pairwise_texts(hp, tokenizer, q["question"], q["solutions"])
            p = dict(
                zip(
                    ordered_pairs(len(q["solutions"])),
                    p_first(model, tokenizer, texts, accept, reject),
                    strict=True,
                )
            )
            scores.append(round_robin_scores(len(q["solutions"]), p).tolist())
        results[f"pairwise_{name}"] = share_solved(index, lambda i, s=scores: s[i])
        picks[name] = scores
        print(f"pairwise votes of {name}: {results[f'pairwise_{name}']:.3f}")
    results["seconds"] = round(time.monotonic() - started, 1)
    results["per_question"] = [
        {"problem_id": q["problem_id"], "likelihood": likelihoods[i]}
        | {f"pairwise_{name}": picks[name][i] for name in picks}
        for i, q in enumerate(questions)
    ]
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
