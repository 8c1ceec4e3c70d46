"""What the verifier trains on: sampled pairs (MALT), label pairs (ours) or both, label balance
among its sampled pairs and warm-start rollouts, and the experiment's built-in arms."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from flows.malt_iteration import malt_iteration
from nip_core.agents.call_journal import read_journal
from nip_core.episode import Datapoint
from nip_core.experiment.config import builtin_overrides
from nip_core.malt import dataset_export as export
from nip_core.malt import verifier_rows
from nip_core.malt.rollout_tree import BatchItem, history, turns_by_node
from nip_core.malt.tree_values import (
    balance_pairs_by_label,
    label_balanced_mask,
    rewards_table,
    settled_labels,
)
from nip_core.parameters import HyperParameters, apply_overrides
from nip_core.parameters.trainers import PureTextEiParameters
from nip_core.run.iteration_context import build_context
from tests.test_dataset_export import Tree, grow, make_context

SOLO = [
    "interaction_protocol=solo_verifier",
    "agents._default.use_dummy_api=true",
    "rl.rollouts_per_iteration=12",
    "text_rl.rollout_shard_size=4",
    "pure_text_malt.num_responses_per_timestep=4",
    "pure_text_malt.pair_selection_method=positive_negative",
]


def _iteration(root: Path, run: str) -> Path:
    return root / run / "iterations" / "0000"


def _sampled_texts(it: Path) -> tuple[dict[str, str], set[str]]:
    """The verifier's reply at every node (nodes.parquet), and every text a model call returned
    (the call journal)."""
    nodes = pd.read_parquet(it / "nodes.parquet")
    by_node = {
        row.node_id: m["content"]
        for row in nodes.itertuples()
        for m in row.raw_messages
        if m["agent"] == "verifier"
    }
    returned = set()
    for journal in it.glob("calls-*.jsonl"):
        for texts in read_journal(journal).values():
            returned.update(texts)
    return by_node, returned


def test_sampled_signal_trains_only_on_replies_the_model_sampled(prefect_harness, tmp_path):
    malt_iteration(
        overrides=[*SOLO, "pure_text_malt.verifier_training_signal=sampled_pairs"],
        run_name="sampled",
        artifacts_root=str(tmp_path),
    )
    it = _iteration(tmp_path, "sampled")
    dpo = pd.read_parquet(it / "datasets" / "dpo" / "verifier.parquet")
    by_node, returned = _sampled_texts(it)
    assert len(dpo) > 0 and returned
    assert not dpo["guess_replaced"].any()
    for row in dpo.itertuples():
        for node, answer in (
            (row.chosen_node_id, row.chosen),
            (row.rejected_node_id, row.rejected),
        ):
            assert node is not None, "every answer names the node it was sampled at"
            assert len(answer) == 1 and answer[0]["role"] == "assistant"
            assert answer[0]["content"] == by_node[node]
            assert answer[0]["content"] in returned, "a text no model call returned"

    # The same tree with label pairs: those answers are ours, and the check above tells them apart.
    malt_iteration(
        overrides=[
            *SOLO,
            "pure_text_malt.verifier_training_signal=label_pairs",
            "text_rl.verifier_guess_replacement_proportion=1.0",
        ],
        run_name="labels",
        artifacts_root=str(tmp_path),
    )
    labels = pd.read_parquet(_iteration(tmp_path, "labels") / "datasets/dpo/verifier.parquet")
    assert len(labels) > 0 and labels["guess_replaced"].all()
    assert labels["chosen_node_id"].isna().all()
    assert {r[0]["content"] for r in labels["chosen"]} == {"Decision: accept", "Decision: reject"}


def test_a_label_share_nothing_reads_is_a_configuration_error():
    hp = HyperParameters.construct_test_params()
    with pytest.raises(ValueError, match="writes label answers"):
        apply_overrides(hp, ["text_rl.verifier_guess_replacement_proportion=0.5"])
    with pytest.raises(ValueError, match="needs text_rl.verifier_guess_replacement_proportion"):
        apply_overrides(hp, ["pure_text_malt.verifier_training_signal=label_pairs"])
    # the expert-iteration warm start reads it
    warm = apply_overrides(
        hp,
        [
            "text_rl.verifier_guess_replacement_proportion=0.5",
            "pure_text_malt.num_initial_ei_iterations=1",
        ],
    )
    assert warm.pure_text_malt.verifier_training_signal == "sampled_pairs"


def test_builtin_arms_say_what_the_verifier_trains_on():
    hp = apply_overrides(
        HyperParameters.construct_test_params(),
        [
            "pure_text_malt.verifier_training_signal=label_pairs",
            "text_rl.verifier_guess_replacement_proportion=0.5",
        ],
    )

    def arm(name):
        return apply_overrides(hp, [f"{k}={v}" for k, v in builtin_overrides(name, 2, hp).items()])

    malt = arm("malt")
    assert malt.pure_text_malt.verifier_training_signal == "sampled_pairs"
    assert malt.text_rl.verifier_guess_replacement_proportion == 0
    labels = arm("label_pairs")
    assert labels.pure_text_malt.verifier_training_signal == "label_pairs"
    assert labels.text_rl.verifier_guess_replacement_proportion == 0.5
    control = arm("shuffled_labels")
    assert control.text_rl.shuffle_training_labels
    assert control.pure_text_malt.verifier_training_signal == "sampled_pairs"
    assert arm("ei").pure_text_malt.num_initial_ei_iterations == 2


def test_label_balance_keeps_as_many_pairs_per_label_counted_by_hand():
    # parents p0..p6: y = 1 on p0-p4, y = 0 on p5-p6; one prover pair that must stay
    nodes = pa.table(
        {
            "node_id": [f"p{i}" for i in range(7)] + ["q"],
            "y": [1, 1, 1, 1, 1, 0, 0, 1],
        }
    )
    pairs = pa.table(
        {
            "agent": ["verifier"] * 7 + ["prover"],
            "parent_node_id": [f"p{i}" for i in range(7)] + ["q"],
        }
    )
    kept = balance_pairs_by_label(pairs, nodes, "verifier", seed=4)
    parents = kept.column("parent_node_id").to_pylist()
    assert len(parents) == 2 + 2 + 1
    assert {"p5", "p6", "q"} <= set(parents)  # the whole smaller side and the prover's pair
    assert sum(p in {"p0", "p1", "p2", "p3", "p4"} for p in parents) == 2
    assert parents == sorted(parents, key=lambda p: (p == "q", p))  # table order kept
    assert kept.equals(balance_pairs_by_label(pairs, nodes, "verifier", seed=4))
    draws = {
        tuple(balance_pairs_by_label(pairs, nodes, "verifier", s).column(1).to_pylist())
        for s in range(20)
    }
    assert len(draws) > 1, "the draw of the larger side depends on the seed"
    # no pair on buggy code: no verifier pair is kept
    none = label_balanced_mask(np.array([True, True, False]), np.array([1, 1, 0]), seed=0)
    assert none.tolist() == [False, False, True]


def test_the_controls_pairs_agree_with_the_truth_as_often_as_they_disagree():
    """The shuffled-label control keeps as many pairs in each (shown label, true label) cell as
    in the rarest: counted by hand, 3 agreeing and 5 disagreeing pairs become 2 and 2."""
    # parent p<i> on datapoint d<i>; shown labels y and the labels before the shuffle
    shown = [1, 1, 1, 0, 0, 0, 1, 0]
    truth = {"d0": 1, "d1": 0, "d2": 0, "d3": 0, "d4": 1, "d5": 1, "d6": 0, "d7": 0}
    nodes = pa.table(
        {
            "node_id": [f"p{i}" for i in range(8)] + ["q"],
            "datapoint_id": [f"d{i}" for i in range(8)] + ["d0"],
            "y": [*shown, 1],
        }
    )
    pairs = pa.table(
        {
            "agent": ["verifier"] * 8 + ["prover"],
            "parent_node_id": [f"p{i}" for i in range(8)] + ["q"],
        }
    )
    kept = balance_pairs_by_label(pairs, nodes, "verifier", seed=2, true_labels=truth)
    parents = [p for p in kept.column("parent_node_id").to_pylist() if p != "q"]
    assert "q" in kept.column("parent_node_id").to_pylist()
    cells = [(shown[int(p[1])], truth[f"d{p[1]}"]) for p in parents]
    assert sorted(cells) == [(0, 0), (0, 1), (1, 0), (1, 1)], "one in each cell: the rarest has 1"
    # the shown labels alone balance 4 against 4 and keep the disagreeing majority
    plain = balance_pairs_by_label(pairs, nodes, "verifier", seed=2)
    assert plain.num_rows == 9
    # a cell with no pair: none of the verifier's pairs is kept
    one_sided = {**truth, "d0": 0}  # no pair shows 1 on truly correct code
    kept = balance_pairs_by_label(pairs, nodes, "verifier", seed=2, true_labels=one_sided)
    assert kept.column("parent_node_id").to_pylist() == ["q"]
    with pytest.raises(ValueError, match="no label before the shuffle for datapoints"):
        balance_pairs_by_label(pairs, nodes, "verifier", seed=2, true_labels={"d0": 1})


def _verdict_tree(decisions: dict[str, list[int | None]]) -> pa.Table:
    """Nodes of parents p<y><i> (label y), each with its leaves' verdicts (None: no verdict)."""
    rows = []
    for parent, verdicts in decisions.items():
        y = int(parent[1])
        rows.append({"node_id": parent, "parent_id": None, "decision": None, "y": y})
        rows += [
            {"node_id": f"{parent}-{k}", "parent_id": parent, "decision": d, "y": y}
            for k, d in enumerate(verdicts)
        ]
    return pa.Table.from_pylist(rows)


def test_a_settled_label_does_not_drop_the_other_labels_pairs():
    """A `nip` verifier that rejects every buggy solution gives no pair on buggy code; sparing a
    settled label keeps its pairs on correct code, which plain balance drops (seed 6200)."""
    # correct code (y = 1): accepts beside no verdicts, 3 parents with pairs; buggy: all rejects
    nodes = _verdict_tree(
        {"p10": [1, None], "p11": [1, None], "p12": [None, 1], "p13": [1, 1],
         "p00": [0, 0], "p01": [0, 0]}
    )  # fmt: skip
    pairs = pa.table({"agent": ["verifier"] * 3, "parent_node_id": ["p10", "p11", "p12"]})
    assert settled_labels(nodes) == {0}
    assert balance_pairs_by_label(pairs, nodes, "verifier", seed=1).num_rows == 0
    spared = balance_pairs_by_label(pairs, nodes, "verifier", seed=1, spare_settled=True)
    assert spared.equals(pairs)
    # one wrong verdict on buggy code: the label is not settled, the balance drops them again
    wrong = _verdict_tree(
        {"p10": [1, None], "p11": [1, None], "p12": [None, 1], "p00": [0, 1], "p01": [0, 0]}
    )
    assert settled_labels(wrong) == frozenset()
    assert balance_pairs_by_label(pairs, wrong, "verifier", 1, spare_settled=True).num_rows == 0
    # a verifier that accepts everything: correct code is settled, buggy code (all wrong) is not
    accepting = _verdict_tree({"p10": [1, 1], "p00": [1, 1]})
    assert settled_labels(accepting) == {1}
    # both labels with pairs: sparing changes nothing (neither is settled)
    both = pa.table({"agent": ["verifier"] * 4, "parent_node_id": ["p10", "p11", "p12", "p00"]})
    mixed = _verdict_tree({"p10": [1, 0], "p11": [1, 0], "p12": [0, 1], "p00": [0, 1]})
    assert balance_pairs_by_label(both, mixed, "verifier", 3, spare_settled=True).equals(
        balance_pairs_by_label(both, mixed, "verifier", 3)
    )
    assert label_balanced_mask(np.array([True, True]), np.array([1, 1]), 0, frozenset({0, 1})).all()
    with pytest.raises(ValueError, match="balance_verifier_by_label=false turns off"):
        apply_overrides(
            HyperParameters.construct_test_params(),
            ["pure_text_malt.balance_spares_settled_labels=true"],
        )


def _solo_items(count: int) -> list[BatchItem]:
    # 3 of every 4 problems have correct code: an imbalance to undo
    return [
        BatchItem(
            i,
            Datapoint(
                700 + i, f"Add {i} to x.", f"def f(x):\n    return x + {i}", int(i % 4 != 0), 1
            ),
            9000 + 17 * i,
        )
        for i in range(count)
    ]


def test_warm_start_rows_are_the_verifiers_own_rewarded_replies_balanced_by_label():
    """The `malt` arm with nip's warm start (expert iteration first): its SFT rows are replies
    the verifier sampled, each from an episode it won, as many on correct code as on buggy."""
    hp = HyperParameters.construct_test_params()
    arm = builtin_overrides("malt", 2, hp) | {
        "interaction_protocol": "solo_verifier",
        "pure_text_malt.num_initial_ei_iterations": 1,
        "pure_text_malt.balance_verifier_by_label": True,
        "pure_text_ei.num_responses_per_timestep": 4,
    }
    hp = apply_overrides(hp, [f"{k}={v}" for k, v in arm.items()])
    ctx = build_context(hp, "warm-start", 0)
    assert ctx.is_ei_iteration and ctx.num_responses_per_timestep == 4
    items = _solo_items(40)
    nodes = grow(ctx, items)
    rewards = rewards_table(nodes, ctx.agent_names, ctx.reward_midpoints, "monte_carlo")
    context = export.ExportContext(
        ctx.protocol, ctx.agent_params, {it.batch_index: it for it in items}, 0
    )
    ei = PureTextEiParameters(reward_threshold=0.9)
    rows = export.sft_rows(
        nodes, rewards, context, ["verifier"], ctx.agent_names, ei, hp.text_rl, 1
    )
    y_of = {it.datapoint.id: it.datapoint.y for it in items}
    by_label = [sum(y_of[r["datapoint_id"]] == y for r in rows) for y in (0, 1)]
    assert 0 < by_label[0] < by_label[1], "the fixture needs rewarded rows of both labels"
    balanced = verifier_rows.balance_verifier_rollouts(rows, "verifier", y_of, seed=2)
    assert [sum(y_of[r["datapoint_id"]] == y for r in balanced) for y in (0, 1)] == [
        by_label[0],
        by_label[0],
    ]
    index = turns_by_node(nodes)
    for row in balanced:
        assert not row["guess_replaced"] and row["episode_reward"] >= 0.9
        reply = row["messages"][-1]
        turns = history(index, row["leaf_node_id"])
        assert reply == {"role": "assistant", "content": turns[-1].raw["verifier"]}


def test_verifier_signal_rows_pick_the_named_source():
    tree = Tree(
        make_context(
            "solo_verifier",
            "pure_text_malt.num_responses_per_timestep=3",
            "text_rl.verifier_guess_replacement_proportion=1.0",
            "pure_text_malt.verifier_training_signal=sampled_and_label_pairs",
        ),
        10,
    )
    hp = tree.ctx.hyper_params
    pairs = tree.pairs()

    def rows(signal):
        malt = replace(hp.pure_text_malt, verifier_training_signal=signal)
        return verifier_rows.verifier_signal_rows(
            tree.nodes, pairs, tree.export, ["verifier"], malt, hp.text_rl, 1
        )

    sampled, labels, both = (
        rows("sampled_pairs"),
        rows("label_pairs"),
        rows("sampled_and_label_pairs"),
    )
    assert sampled and labels
    assert not any(r["guess_replaced"] for r in sampled)
    assert all(r["guess_replaced"] for r in labels)
    assert both == sampled + labels
    assert json.dumps(both, sort_keys=True, default=str)  # plain data, as exported
