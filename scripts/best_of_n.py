"""Best-of-N by pairwise votes: pick the correct solution among a question's N candidates.

    python scripts/best_of_n.py --config configs/experiment-cpu-pairwise.yaml \\
        --adapter malt=artifacts/<experiment>/seeds/<seed>/base/lm_server/jobs/<job>/output \\
        --out docs/results/<folder>/best-of-n.json

The candidates of a test question are its distinct solutions in humaneval-buggy: the correct
one and the buggy ones of every grade (the easy stub, the medium, hard and mixed mutations),
3 to 5 per question, shown as the config shows solutions. Every ordered pair goes to the
verifier in the config's pair protocol's own prompt (`nip_core.agents.prompts`; a solo config
is shown in the pairwise one), and P(Solution A is correct) is the softmax of its
log-probabilities of its two verdict replies, "Decision: accept" and "Decision: reject", or in
the fill-in protocols the two versions of the disputed part per token
(`nip_core.malt.verdict_scores`, the experiments' verdict scores, scored by the server's own
`message_logprobs`). Each candidate's
score sums its probability of being the correct one over both orders of every pair
(`nip_core.experiment.best_of_n`), and a question is solved when its top-ranked candidate is the
correct one. Beside each verifier (the frozen base model, and every `--adapter` on it): the
likelihood ranking (the candidate with the highest mean log-probability per token as the model's
reply to the question, as the experiments' likelihood baseline scores it) and a random pick (1/N). Runs the model in this process (transformers,
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
from nip_core.agents.message_scores import scored_once  # noqa: E402
from nip_core.agents.prompts import verdict_reply  # noqa: E402
from nip_core.data.loaders import humaneval_file, shown_solutions  # noqa: E402
from nip_core.data.pairwise import shows_pairs, writes_disputed_part  # noqa: E402
from nip_core.episode import ACCEPT, REJECT, Datapoint  # noqa: E402
from nip_core.experiment.arm_results import solution_reply  # noqa: E402
from nip_core.experiment.best_of_n import ordered_pairs, round_robin_scores, share_solved  # noqa: E402
from nip_core.lm_server.embedded_model import embedded_model_path  # noqa: E402
from nip_core.lm_server.engines.hf_scoring import message_logprobs  # noqa: E402
from nip_core.malt.verdict_scores import pair_accept_probability  # noqa: E402
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


@torch.no_grad()
def mean_logprobs(model, tokenizer, question: str, solutions: list[str]) -> list[float]:
    """Mean log-probability per token of each solution as the model's reply to `question`."""
    chats = [solution_reply(question, code) for code in solutions]
    scores = message_logprobs(model, tokenizer, chats, model.device)
    return [total / max(tokens, 1) for total, tokens in scores]


@torch.no_grad()
def p_first(model, tokenizer, hp, question: str, solutions: list[str]) -> list[float]:
    """P(Solution A is correct) for every ordered pair of `solutions` (`ordered_pairs` order):
    the verifier's prompt, then its two verdict replies scored (in the fill-in protocols the two
    versions of the disputed part, compared per token, as the experiments' P(accept))."""
    protocol, params = make_protocol(hp), hp.agents["_default"]
    chats = []
    for first, second in ordered_pairs(len(solutions)):
        point = Datapoint(0, question, solutions[first], 1, 1, other_solution=solutions[second])
        prompt = chat_messages(protocol, "verifier", params, point, [], 0, 0)
        for verdict in (ACCEPT, REJECT):
            reply = {"role": "assistant", "content": verdict_reply(protocol, point, verdict)}
            chats.append(fold_speaker_names([*prompt, reply]))
    scores = scored_once(
        lambda unique: message_logprobs(model, tokenizer, unique, model.device), chats
    )
    per_token = writes_disputed_part(protocol.name)
    return [
        pair_accept_probability(accept, reject, per_token)
        for accept, reject in zip(scores[::2], scores[1::2], strict=True)
    ]


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
    if not shows_pairs(data.get("interaction_protocol", "nip")):
        data["interaction_protocol"] = "pairwise"  # a solo config: its prompt settings, in pairs
    hp = HyperParameters.from_dict(data)
    docstring = hp.dataset_options.solution_docstring
    questions = candidates(args.split, docstring)[: args.limit]
    path = str(embedded_model_path())
    tokenizer = AutoTokenizer.from_pretrained(path)
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
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
    likelihoods = [mean_logprobs(base, tokenizer, q["question"], q["solutions"]) for q in questions]
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
            p = dict(
                zip(
                    ordered_pairs(len(q["solutions"])),
                    p_first(model, tokenizer, hp, q["question"], q["solutions"]),
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
