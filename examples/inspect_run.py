# %% [markdown]
# # Inspecting a MALT run
#
# A notebook-style script (open it in VS Code / Jupyter as cells, or run it whole):
#
#     python examples/inspect_run.py artifacts/exp1
#
# It answers the questions people ask first about a run folder: how did the verifier's accuracy
# move, which pairs were chosen for the verifier (and what the two responses said), and what one
# whole conversation looked like. Everything is a pandas DataFrame read from the run's Parquet
# and JSON files; nothing is recomputed.

# %%
import sys

import pandas as pd

from nip_core.report import read_run

pd.set_option("display.width", 160)
pd.set_option("display.max_columns", 20)
pd.set_option("display.max_colwidth", 70)

RUN = sys.argv[1] if len(sys.argv) > 1 else "artifacts/default"
run = read_run(RUN)
print(run)
last = run.iterations[-1]

# %% [markdown]
# ## How did accuracy move?
# `run.stats` has one row per iteration with every manifest statistic as a dotted column.

# %%
metrics = ["verifier.accuracy", "verifier.precision", "verifier.recall", "verifier.decision_rate"]
evaluation = [c for c in run.stats.columns if c in {"eval.accuracy", "eval.precision"}]
print(run.stats.set_index("iteration")[metrics + evaluation].round(3))

# %% [markdown]
# ## How many pairs did each agent get?

# %%
pair_columns = [c for c in run.stats.columns if c.endswith((".pairs", ".pair_proportion"))]
print(run.stats.set_index("iteration")[pair_columns].round(3).T)

# %% [markdown]
# ## Which pairs were chosen for the verifier?
# Each pair is two sibling responses under one parent node: the chosen one had the higher
# expected reward for the verifier.

# %%
pairs = run.pairs(last)
verifier_pairs = pairs[pairs["agent"] == "verifier"]
print(
    verifier_pairs[
        [
            "parent_node_id",
            "chosen_node_id",
            "rejected_node_id",
            "chosen_expected_reward",
            "rejected_expected_reward",
        ]
    ].head(10)
)

# %% [markdown]
# ## The two responses of one verifier pair
# The DPO dataset of the verifier's model group carries the prompt and both completions
# (group names: `run.groups(iteration)`; the verifier is usually in a group of its own).

# %%
group = next((g for g in run.groups(last) if g == "verifier"), None)
if group is not None and not verifier_pairs.empty:
    dpo = run.dpo(last, group)
    row = dpo.iloc[0]
    print(f"pair under {row['parent_node_id']}:")
    print("  chosen:  ", row["chosen"][-1]["content"], f"(E = {row['chosen_expected_reward']:.3f})")
    print(
        "  rejected:",
        row["rejected"][-1]["content"],
        f"(E = {row['rejected_expected_reward']:.3f})",
    )
else:
    print("no verifier DPO dataset in this iteration")

# %% [markdown]
# ## A whole conversation
# `transcript(node_id)` walks the tree from the root to the node and lists every message.

# %%
if not verifier_pairs.empty:
    node = verifier_pairs.sort_values("round")["chosen_node_id"].iloc[-1]  # a deep one
else:
    node = run.nodes(last)["node_id"].iloc[-1]
print(run.transcript(node, iteration=last)[["round", "agent", "channel", "content", "decision"]])

# %% [markdown]
# ## Expected rewards along the tree
# `rewards(i)` has one row per (node, agent); join it to the nodes for anything else.

# %%
rewards = run.rewards(last)
by_round = rewards[rewards["active"]].groupby(["agent", "round"])["expected_reward"].mean()
print(by_round.unstack("round").round(3))

# %% [markdown]
# The same pictures as a page: `python -m flows.report <run folder>` writes `report.html`.
