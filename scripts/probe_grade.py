"""Does the frozen base model tell correct code from buggy code? Linear probes per bug grade.

For each grade (`--difficulties`), every train and test solution goes into the solo verifier's
chat, "Decision:" appended, through the embedded SmolLM2-135M-Instruct once; the hidden state at
that last position and the mean over all positions, at a few layers, are the features. A
logistic regression (nip_core.experiment.probe: penalty chosen by cross-validation with each
question's two solutions in one fold) is fitted on the train split and scored on the test split:
its AUC, and its paired accuracy (the share of test questions whose correct solution scores above
its buggy twin; 0.5 for anything reading only the question). Beside them: for the probe that
cross-validation ranks best, its paired accuracy on twins of equal token count and per kind of
mutation, and the same features fitted on shuffled train labels (the control); scores read off the
model with no fitting (the prompt's log-probability, per token, and its token count); and the
base verifier's own P(accept) at that position. Prints one JSON line per result and writes them
all to `--out`; `--features` keeps each grade's features, so a rerun fits without the model.

    python scripts/probe_grade.py --out docs/results/probe-grades/probes.json
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

from nip_core.data.splits import load_split  # noqa: E402
from nip_core.experiment.auc import auc  # noqa: E402
from nip_core.experiment.probe import paired_accuracy, probe, twin_outcomes  # noqa: E402
from nip_core.lm_server.embedded_model import embedded_model_path  # noqa: E402
from scripts.ladder_fit import hp_for, prompts, verdict_tokens  # noqa: E402


@torch.no_grad()
def features(model, tok, chats, layers, cache):
    """(last-position states, mean states, P(accept), token count, log-probability of the
    chat's text) for each chat; `cache` holds texts seen before (a correct solution's chat is
    the same on every grade)."""
    accept, reject = verdict_tokens(tok)
    columns = []
    for number, chat in enumerate(chats):
        if number and number % 50 == 0:
            print(f"  {number} of {len(chats)} chats", file=sys.stderr, flush=True)
        text = (
            tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False) + "Decision:"
        )
        if text not in cache:
            ids = tok(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
            out = model(input_ids=ids, output_hidden_states=True)
            states = torch.stack([out.hidden_states[layer][0] for layer in layers])  # (L, T, H)
            logits = torch.log_softmax(out.logits[0].float(), -1)
            own = logits[:-1].gather(1, ids[0, 1:, None])[:, 0]  # each token's log-probability
            cache[text] = (
                states[:, -1].numpy(),
                states.mean(dim=1).numpy(),
                float(torch.sigmoid(logits[-1, accept] - logits[-1, reject])),
                ids.shape[1],
                float(own.sum()),
            )
        columns.append(cache[text])
    last, mean, p_accept, tokens, logprob = zip(*columns, strict=True)
    return np.stack(last), np.stack(mean), np.array(p_accept), np.array(tokens), np.array(logprob)


def grade_rows(model, tok, difficulty, seed, layers, cache, saved: Path | None):
    """Features, labels, question and mutation of every train and test row of one grade, read
    from `saved` (an .npz this script wrote) when it exists."""
    if saved is not None and saved.exists():
        with np.load(saved, allow_pickle=True) as stored:
            return {split: stored[split].item() for split in ("train", "test")}
    hp = hp_for(seed, difficulty)
    out = {}
    for split in ("train", "test"):
        rows = prompts(hp, split)
        last, mean, p, tokens, logprob = features(
            model, tok, [chat for _, chat in rows], layers, cache
        )
        frame = load_split(hp, split).set_index("id")
        out[split] = {
            "last": last,
            "mean": mean,
            "p_accept": p,
            "tokens": tokens,
            "logprob": logprob,
            "y": np.array([dp.y for dp, _ in rows]),
            "question": [dp.question for dp, _ in rows],
            "mutation": [str(frame.loc[dp.id, "mutation"] or "") for dp, _ in rows],
        }
    if saved is not None:
        saved.parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(saved, train=out["train"], test=out["test"])
    return out


def twin_wins(scores, split):
    """(mutation kind, same token count, 1 / 0.5 / 0) for each question holding both
    solutions: whether the correct one scores above the buggy one."""
    return [
        (
            split["mutation"][buggy].split(":")[0],
            split["tokens"][correct] == split["tokens"][buggy],
            win,
        )
        for correct, buggy, win in twin_outcomes(scores, split["y"], split["question"])
    ]


def confound_checks(result, train, test):
    """Where a probe's paired accuracy comes from: twins whose prompts have the same token
    count (a length cue cannot rank them), and each kind of mutation (held-out train scores
    and test scores pooled)."""
    out = {}
    for name, split, scores in (
        ("validation", train, result.validation_scores),
        ("test", test, result.test_scores),
    ):
        wins = twin_wins(scores, split)
        same = [win for _, same_length, win in wins if same_length]
        out[f"{name}_same_length_paired_accuracy"] = float(np.mean(same)) if same else float("nan")
        out[f"{name}_same_length_twins"] = len(same)
    return out | by_mutation(((train, result.validation_scores), (test, result.test_scores)))


def by_mutation(scored_splits):
    """Paired accuracy per kind of mutation, the splits' questions pooled: [accuracy, count]."""
    kinds = {}
    for split, scores in scored_splits:
        for kind, _, win in twin_wins(scores, split):
            kinds.setdefault(kind, []).append(win)
    return {
        "paired_accuracy_by_mutation": {
            kind: [round(float(np.mean(wins)), 3), len(wins)]
            for kind, wins in sorted(kinds.items())
        }
    }


def score_rules(train, test):
    """Scores read straight off the frozen model, no fitting: the prompt's token count (longer =
    correct) and its log-probability under the model (more likely = correct: a mutant is
    less natural code), summed and per token."""
    rules = {
        "token count (longer = correct)": lambda split: split["tokens"],
        "log-probability (higher = correct)": lambda split: split["logprob"],
        "log-probability per token": lambda split: split["logprob"] / split["tokens"],
    }
    lines = []
    for name, score in rules.items():
        line = {"features": name}
        for split_name, split in (("validation", train), ("test", test)):
            line[f"{split_name}_auc"] = auc(score(split), split["y"])
            line[f"{split_name}_paired_accuracy"] = paired_accuracy(
                score(split), split["y"], split["question"]
            )
        lines.append(line | by_mutation((split, score(split)) for split in (train, test)))
    return lines


def fitted(train, test, pooling, index, labels, seed):
    """The probe on one feature set, fitted on the train rows with `labels`."""
    return probe(
        train[pooling][:, index], labels, train["question"],
        test[pooling][:, index], test["y"], test["question"], seed=seed,
    )  # fmt: skip


def probe_lines(difficulty, data, layers, seed):
    """One result per (pooling, layer), the one cross-validation ranks best with its confound
    checks and shuffled-label control, the rules read off the model and the verdict's own
    P(accept)."""
    train, test = data["train"], data["test"]
    results = {
        f"{pooling}@{layer}": fitted(train, test, pooling, index, train["y"], seed)
        for pooling in ("last", "mean")
        for index, layer in enumerate(layers)
    }
    lines = [{"features": name, **result.metrics()} for name, result in results.items()]
    best = max(results, key=lambda name: results[name].validation_paired_accuracy)
    checks = confound_checks(results[best], train, test)
    lines.append(
        {
            "features": f"{best} (best validation paired accuracy)",
            **results[best].metrics(),
            **checks,
        }
    )
    pooling, layer = best.split("@")
    shuffled = np.random.default_rng(seed).permutation(train["y"])
    control = fitted(train, test, pooling, layers.index(int(layer)), shuffled, seed)
    lines.append({"features": f"{best}, shuffled train labels", **control.metrics()})
    lines += score_rules(train, test)
    verdict = test["p_accept"], test["y"]
    lines.append({
        "features": "base verdict P(accept)",
        "test_auc": auc(*verdict),
        "test_paired_accuracy": paired_accuracy(*verdict, test["question"]),
    })  # fmt: skip
    return [{"grade": difficulty, **line} for line in lines]


def plain(value):
    """JSON-ready: numpy numbers as Python ones, NaN as null (strict JSON has no NaN)."""
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain(item) for item in value]
    if isinstance(value, (float, np.floating)):
        return None if np.isnan(value) else float(value)
    return int(value) if isinstance(value, np.integer) else value


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--difficulties", default="easy,medium,mixed")
    parser.add_argument("--seed", type=int, default=7201, help="carves validation out of train")
    parser.add_argument("--layers", default="6,12,18,24,30")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--features", type=Path, help="folder for each grade's features (.npz), reused when there"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    layers = [int(layer) for layer in args.layers.split(",")]
    path = embedded_model_path()
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    cache, lines, started = {}, [], time.time()
    for difficulty in args.difficulties.split(","):
        saved = args.features / f"{difficulty}-{args.seed}.npz" if args.features else None
        data = grade_rows(model, tok, difficulty, args.seed, layers, cache, saved)
        for line in probe_lines(difficulty, data, layers, args.seed):
            line = plain(line) | {"seconds": round(time.time() - started)}
            print(json.dumps(line), flush=True)
            lines.append(line)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(lines, indent=1) + "\n")


if __name__ == "__main__":
    main()
