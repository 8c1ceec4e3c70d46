"""Rung (a) of docs/learning.md: can the trainer fit the label pairs it trains on?

Builds a bug grade's label pairs (`--difficulty`, easy by default) for one training batch
straight from the data (the solo verifier's chat, "Decision: <true>" over "Decision: <false>",
one per problem, alternating the true verdict), trains them with the server's own training code
path (nip_core.lm_server.training), then prints the verdict accuracy, accept rate and AUC on the
training rows and on the test split, read off P(accept) at the verdict token (no sampling).

    python scripts/ladder_fit.py --epochs 4 --accum 2 --lr 6e-4 --rpo 0.2 --warmup 0.1
"""

import argparse
import json
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from nip_core.agents import chat_messages  # noqa: E402
from nip_core.data.loaders import datapoints  # noqa: E402
from nip_core.data.splits import load_split  # noqa: E402
from nip_core.experiment.auc import auc  # noqa: E402
from nip_core.experiment.probe import paired_accuracy  # noqa: E402
from nip_core.lm_server import training  # noqa: E402
from nip_core.lm_server.embedded_model import embedded_model_path  # noqa: E402
from nip_core.lm_server.options import TrainingOptions  # noqa: E402
from nip_core.malt.batching import iteration_positions  # noqa: E402
from nip_core.model_api.chat_format import fold_speaker_names  # noqa: E402
from nip_core.parameters import HyperParameters  # noqa: E402
from nip_core.parameters.loading import read_params_file  # noqa: E402
from nip_core.protocols.build import make_protocol  # noqa: E402


def hp_for(seed=6198, difficulty="easy", config="experiment-cpu-easy.yaml"):
    data = read_params_file(REPO / "configs" / config)
    data.pop("experiment")
    data["seed"] = seed
    data["dataset_options"] = {"difficulty": difficulty}
    return HyperParameters.from_dict(data)


def prompts(hp, split):
    protocol = make_protocol(hp)
    params = hp.agents["verifier"] if "verifier" in hp.agents else hp.agents["_default"]
    frame = load_split(hp, split)
    dps = datapoints(frame)
    out = []
    for dp in dps:
        chat = chat_messages(protocol, "verifier", params, dp, [], 0, 0)
        out.append((dp, fold_speaker_names(chat)))
    return out


def train_batch(hp, n=32):
    rows = prompts(hp, "train")
    _, positions = iteration_positions(len(rows), hp.seed, 0, n)
    return [rows[p] for p in positions]


def twin_batch(hp, n=32):
    """`n // 2` train questions drawn by the seed, each with both of its solutions (correct and
    buggy): the rows of a question differ only in the code, so nothing but the bug tells them
    apart."""
    rows = prompts(hp, "train")
    by_question = {}
    for dp, chat in rows:
        by_question.setdefault(dp.question, []).append((dp, chat))
    twins = [pair for pair in by_question.values() if {dp.y for dp, _ in pair} == {0, 1}]
    random.Random(hp.seed).shuffle(twins)
    return [row for pair in twins[: n // 2] for row in pair]


def verdict_tokens(tok):
    """The first token of " accept" and of " reject" (what follows "Decision:")."""
    return tuple(
        tok(word, add_special_tokens=False)["input_ids"][0] for word in (" accept", " reject")
    )


@torch.no_grad()
def verdict_probs(model, tok, chats):
    model.eval()
    accept, reject = verdict_tokens(tok)
    out = []
    for chat in chats:
        text = (
            tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False) + "Decision:"
        )
        ids = tok(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
        logits = model(input_ids=ids, logits_to_keep=1).logits[0, -1]
        lp = torch.log_softmax(logits.float(), -1)
        out.append(float(torch.sigmoid(lp[accept] - lp[reject])))
    return np.array(out)


def report(name, p, y):
    pred = (p > 0.5).astype(int)
    print(
        f"{name}: acc {np.mean(pred == y):.3f} accept {pred.mean():.3f} auc {auc(p, y):.3f}",
        flush=True,
    )


class Log(TrainerCallback):
    def __init__(self):
        self.t = time.time()
        self.rows = []

    def on_log(self, args, state, control, logs=None, **kw):
        logs = logs or {}
        keep = {
            k: round(v, 4)
            for k, v in logs.items()
            if isinstance(v, (int, float))
            and any(
                s in k for s in ("loss", "margin", "logps", "accur", "learning_rate", "grad_norm")
            )
        }
        self.rows.append({"step": state.global_step, "t": round(time.time() - self.t, 1), **keep})
        print(json.dumps(self.rows[-1]), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=6198)
    ap.add_argument("--difficulty", default="easy", help="bug grade: easy, mixed, ...")
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--bs", type=int, default=1)
    ap.add_argument("--accum", type=int, default=1)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--rpo", type=float, default=1.0)
    ap.add_argument("--beta", type=float, default=0.1)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--sched", default="linear")
    ap.add_argument("--warmup", type=float, default=0.0)
    ap.add_argument("--method", default="dpo")
    ap.add_argument("--shuffle-seed", type=int, default=0)
    ap.add_argument("--eval-test", type=int, default=1)
    ap.add_argument("--shuffle-labels", type=int, default=0)
    ap.add_argument("--checkpointing", type=int, default=0)
    ap.add_argument(
        "--twins", type=int, default=0, help="1: n/2 questions, each with both its solutions"
    )
    a = ap.parse_args()
    torch.set_num_threads(2)
    hp = hp_for(a.seed, a.difficulty)
    batch = twin_batch(hp, a.n) if a.twins else train_batch(hp, a.n)
    labels = [dp.y for dp, _ in batch]
    if a.shuffle_labels:
        labels = list(np.random.default_rng(a.seed).permutation(labels))
    acc_rows = [(c, y) for (dp, c), y in zip(batch, labels, strict=False) if y == 1]
    rej_rows = [(c, y) for (dp, c), y in zip(batch, labels, strict=False) if y == 0]
    k = min(len(acc_rows), len(rej_rows))
    uniq = acc_rows[:k] + rej_rows[:k]

    def row(chat, y):
        t, f = ("accept", "reject") if y == 1 else ("reject", "accept")
        if a.method == "dpo":
            return {
                "prompt": chat,
                "chosen": [{"role": "assistant", "content": f"Decision: {t}"}],
                "rejected": [{"role": "assistant", "content": f"Decision: {f}"}],
            }
        return {"messages": chat + [{"role": "assistant", "content": f"Decision: {t}"}]}

    acc = [row(c, y) for c, y in uniq if y == 1]
    rej = [row(c, y) for c, y in uniq if y == 0]
    random.Random(a.shuffle_seed).shuffle(acc)
    random.Random(a.shuffle_seed + 1).shuffle(rej)
    rows = [r for pair in zip(acc, rej, strict=False) for r in pair] * a.repeat
    print(f"unique {len(uniq)} rows {len(rows)}", flush=True)
    opts = TrainingOptions(
        method=a.method,
        n_epochs=a.epochs,
        batch_size=a.bs,
        learning_rate=a.lr,
        beta=a.beta,
        lora_rank=a.rank,
        lora_alpha=2.0 * a.rank,
        lora_dropout=0.0,
        rpo_alpha=a.rpo,
        seed=a.shuffle_seed,
        gradient_accumulation_steps=a.accum,
        shuffle=False,
        # as the experiment configs train (`training_activation_checkpointing: false`): kept
        # activations, each pair's prompt run once; checkpointing took ~3x longer a step here
        activation_checkpointing=bool(a.checkpointing),
    )
    base = str(embedded_model_path())
    model, peft_cfg, _ = training.load_for_training(base, None, opts)
    tok = training.load_tokenizer(base)
    orig = training.trainer_config

    def cfg(options, out, **ov):
        return orig(options, out, **ov, lr_scheduler_type=a.sched, warmup_steps=a.warmup)

    training.trainer_config = cfg
    log = Log()
    tr = training.build_trainer(
        opts, model, tok, rows, "/tmp/probe-trainer", peft_cfg, callbacks=[log]
    )
    t0 = time.time()
    tr.train()
    print(f"train seconds {time.time() - t0:.0f}", flush=True)
    m = tr.model
    p = verdict_probs(m, tok, [c for c, _ in uniq])
    report("train", p, np.array([y for _, y in uniq]))
    if a.eval_test:
        te = prompts(hp, "test")
        p = verdict_probs(m, tok, [c for _, c in te])
        report("test", p, np.array([dp.y for dp, _ in te]))
        paired = paired_accuracy(p, [dp.y for dp, _ in te], [dp.question for dp, _ in te])
        print(f"test paired accuracy {paired:.3f}", flush=True)


if __name__ == "__main__":
    main()
