"""Does the fill-in-by-choice prompt's form cost the frozen model its ranking of a question's twins?

`fill_in_choice` reads the verifier's verdict from its own probability of writing each version of
the disputed part. Its base ranked the medium grade's twins below the `chat_fill` reading of
`scripts/probe_line_choice.py` (a user turn, a shorter ask, no system prompt of ours). This scores,
with the embedded SmolLM2-135M-Instruct in fp32 and no sampling, each question's two candidate
replies (the protocol's own, `reply_candidates`) after four forms of the protocol's own chat:

- `system_as_shipped`: the chat the protocol sends (its system prompt alone);
- `user_as_shipped`: the same text as a user turn (the model's default system prompt);
- `system_plain_ask` / `user_plain_ask`: the same, its closing instructions cut to
  "Write the missing part only." (the probe's ask).

Each form's paired accuracy: the share of questions whose correct version scores higher per
token (ties one half). Prints one JSON line.

    python scripts/probe_fill_in_prompt.py --split validation --seed 7002
"""

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
from probe_line_choice import Scorer  # noqa: E402  (this folder: the same frozen-model scorer)

from nip_core.agents.prompts import chat_messages  # noqa: E402
from nip_core.agents.respond import reply_candidates  # noqa: E402
from nip_core.data import datapoints  # noqa: E402
from nip_core.data.splits import load_split  # noqa: E402
from nip_core.parameters import HyperParameters  # noqa: E402
from nip_core.parameters.loading import read_params_file  # noqa: E402
from nip_core.run.iteration_context import build_context  # noqa: E402

ASK = "Write the missing part only"


def prompt_forms(system: str) -> dict[str, list[dict]]:
    """The protocol's system prompt in four forms: as sent, as a user turn, and both with the
    closing instructions cut to the probe's short ask."""
    plain = system[: system.index(ASK)] + ASK + "."
    return {
        "system_as_shipped": [{"role": "system", "content": system}],
        "user_as_shipped": [{"role": "user", "content": system}],
        "system_plain_ask": [{"role": "system", "content": plain}],
        "user_plain_ask": [{"role": "user", "content": plain}],
    }


def per_token(scorer: Scorer, chat: list[dict], reply: str) -> float:
    """Mean log-probability of `reply` as the assistant's answer to `chat`."""
    text = scorer.tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    return scorer.continuation(scorer.ids(text), reply)[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", default="validation", choices=("validation", "test"))
    parser.add_argument("--seed", type=int, default=7002)
    parser.add_argument("--difficulty", default="medium", choices=("easy", "medium", "mixed"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    data = read_params_file(REPO / "configs" / "experiment-cpu-fill-in-choice.yaml")
    data.pop("experiment", None)
    data["seed"] = args.seed
    data["dataset_options"]["difficulty"] = args.difficulty
    hp = HyperParameters.from_dict(data)
    context = build_context(hp, "probe", 0)
    protocol, verifier = context.protocol, context.protocol.verifier_name
    params = context.agent_params[verifier]
    # One datapoint a question: its correct solution shown as Solution A (both orders hold the
    # same two candidate replies, and the chat shows neither).
    points = [p for p in datapoints(load_split(hp, args.split)) if p.y == 1]
    scorer, wins, start = Scorer(args.threads), {}, time.monotonic()
    for point in points:
        chat = chat_messages(protocol, verifier, params, point, [], 0, 0)
        if len(chat) != 1:
            raise SystemExit(f"expected the protocol's chat to be its system prompt alone: {chat}")
        correct, buggy = reply_candidates(protocol, verifier, point)
        for name, form in prompt_forms(chat[0]["content"]).items():
            good, bad = per_token(scorer, form, correct), per_token(scorer, form, buggy)
            wins.setdefault(name, []).append(1.0 if good > bad else 0.5 if good == bad else 0.0)
    result = {
        "split": args.split,
        "seed": args.seed,
        "difficulty": args.difficulty,
        "questions": len(points),
        "seconds": round(time.monotonic() - start, 1),
        **{name: round(float(np.mean(v)), 3) for name, v in wins.items()},
    }
    print(json.dumps(result), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
