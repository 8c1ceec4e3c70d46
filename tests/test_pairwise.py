"""The pairwise protocol: two solutions to one question, both orders, which one is correct."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
import yaml

from flows.experiment import main as experiment_main
from nip_core.agents import chat_messages
from nip_core.data import datapoints
from nip_core.data.pairwise import pair_buggy_id, pair_id, pairwise_frame, solution_difference
from nip_core.data.splits import load_split, pooled_pairs
from nip_core.episode import ACCEPT, REJECT
from nip_core.experiment.reference import LIKELIHOOD_ARM, REFERENCE_ARMS, likelihood_rows
from nip_core.parameters import HyperParameters
from nip_core.protocols import active_agents, make_protocol, step_outcome

ROWS = pd.DataFrame(
    {
        "id": [100, 101, 200, 201, 202, 300],
        "problem_id": ["p1", "p1", "p2", "p2", "p2", "p3"],
        "question": ["Q1", "Q1", "Q2", "Q2", "Q2", "Q3"],
        "solution": ["good1", "bad1", "good2", "bad2a", "bad2b", "lonely"],
        "y": [1, 0, 1, 0, 0, 1],
        "prover_stance": [1, 0, 1, 1, 0, 1],
        "mutation": [None, "m1", None, "m2a", "m2b", None],
    }
)


def hyper(**overrides) -> HyperParameters:
    data = {
        "scenario": "code_validation",
        "trainer": "pure_text_malt",
        "dataset": "humaneval-buggy",
        "dataset_options": {"difficulty": "medium", "solution_docstring": "dropped"},
        "interaction_protocol": "pairwise",
        "seed": 5,
        "agents": {"_default": {"use_dummy_api": True}},
        "text_rl": {"validation_fraction": 0.2},
    }
    return HyperParameters.from_dict(data | overrides)


def run_dummy_pair_experiment(protocol: str, root: Path) -> Path:
    """Runs a one-iteration `malt` experiment of a pair protocol on the dummy backend (medium
    grade, seed 11, sampled pairs only) under `root`; its folder."""
    config = {
        "scenario": "code_validation",
        "trainer": "pure_text_malt",
        "dataset": "humaneval-buggy",
        "dataset_options": {"difficulty": "medium", "solution_docstring": "dropped"},
        "interaction_protocol": protocol,
        "seed": 11,
        "agents": {"_default": {"use_dummy_api": True}},
        "rl": {"rollouts_per_iteration": 8},
        "text_rl": {"validation_fraction": 0.2},
        "pure_text_malt": {
            "num_responses_per_timestep": 4,
            "verifier_training_signal": "sampled_pairs",
        },
        "experiment": {
            "iterations": 1,
            "samples_per_test_datapoint": 1,
            "bootstrap_resamples": 50,
            "arms": {"malt": {}},
        },
    }
    path = root / f"{protocol}.yaml"
    path.write_text(yaml.safe_dump(config))
    args = ["--config", str(path), "--artifacts-root", str(root), "--run-name", protocol]
    assert experiment_main([*args, "--no-wandb"]) == 0
    return root / protocol


def test_every_correct_buggy_pair_is_shown_in_both_orders():
    pairs = pairwise_frame(ROWS)
    # p1: one pair, p2: two (one per buggy row), p3: no buggy row, no pair; two orders each
    assert len(pairs) == 6
    first = pairs[pairs["y"] == 1]
    second = pairs[pairs["y"] == 0]
    assert set(first["solution"]) == {"good1", "good2"}
    assert set(second["other_solution"]) == {"good1", "good2"}
    assert set(second["solution"]) == {"bad1", "bad2a", "bad2b"}
    assert pairs["id"].is_unique and pairs["id"].is_monotonic_increasing
    assert pair_id(101, True) in set(pairs["id"]) and pair_id(101, False) in set(pairs["id"])
    assert {pair_buggy_id(pair_id(101, first)) for first in (True, False)} == {101}
    assert set(pairs.loc[pairs["problem_id"] == "p2", "mutation"]) == {"m2a", "m2b"}


def test_a_question_with_two_correct_solutions_is_refused():
    twice = pd.concat([ROWS, ROWS.iloc[[0]].assign(id=102)], ignore_index=True)
    with pytest.raises(ValueError, match="2 correct solutions"):
        pairwise_frame(twice)


def test_splits_hold_balanced_pairs_and_keep_a_question_on_one_side():
    hp = hyper()
    splits = {name: load_split(hp, name) for name in ("train", "validation", "test")}
    for frame in splits.values():
        assert frame["y"].mean() == 0.5  # both orders of every pair
        assert frame["other_solution"].notna().all()
    train, validation = set(splits["train"]["problem_id"]), set(splits["validation"]["problem_id"])
    assert validation and not train & validation


def test_the_control_shuffles_the_pairs_labels_not_the_solutions():
    hp = hyper(text_rl={"validation_fraction": 0.2, "shuffle_training_labels": True})
    shuffled, true = load_split(hp, "train"), load_split(hyper(), "train")
    assert list(shuffled["solution"]) == list(true["solution"])
    assert sorted(shuffled["y"]) == sorted(true["y"]) and list(shuffled["y"]) != list(true["y"])


def test_another_grade_joins_the_train_split_and_no_other():
    plain = hyper()
    pooled = hyper(
        dataset_options={
            "difficulty": "medium",
            "solution_docstring": "dropped",
            "train_extra_difficulty": "hard",
        }
    )
    train, plain_train = load_split(pooled, "train"), load_split(plain, "train")
    assert set(train["difficulty"]) == {"medium", "hard"}
    assert set(plain_train["id"]) < set(train["id"]) and train["id"].is_unique
    assert train["y"].mean() == 0.5  # the extra grade's pairs come in both orders too
    for split in ("validation", "test"):  # what the guard and the reports measure is unchanged
        pd.testing.assert_frame_equal(load_split(pooled, split), load_split(plain, split))
    validation = set(load_split(pooled, "validation")["problem_id"])
    assert validation and not validation & set(train["problem_id"])


def test_a_pooled_pair_that_shows_the_same_solutions_is_left_out():
    pairs = pairwise_frame(ROWS)
    same_bug = ROWS.assign(id=ROWS["id"] + 5)  # another grade whose bugs are these very ones
    other_bug = same_bug.assign(solution=same_bug["solution"].replace("bad1", "bad1-hard"))
    assert pooled_pairs(pairs, pairwise_frame(same_bug)).equals(pairs)
    pooled = pooled_pairs(pairs, pairwise_frame(other_bug))
    assert len(pooled) == len(pairs) + 2 and "bad1-hard" in set(pooled["solution"])
    with pytest.raises(ValueError, match="share a pair id"):
        pooled_pairs(pairs, pairwise_frame(other_bug.assign(id=ROWS["id"])))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"interaction_protocol": "solo_verifier"}, "only a pairwise protocol shows"),
        ({"dataset_options": {"difficulty": "hard"}}, "already gives"),
    ],
)
def test_pooling_a_grade_is_refused_where_it_means_nothing(overrides, message):
    options = {"difficulty": "medium", "train_extra_difficulty": "hard"}
    options |= overrides.pop("dataset_options", {})
    with pytest.raises(ValueError, match=message):
        hyper(dataset_options=options, **overrides)


def test_one_verifier_round_rewards_naming_the_correct_solution():
    protocol = make_protocol(hyper())
    assert protocol.agent_names == ("verifier",) and protocol.max_message_rounds == 1
    assert active_agents(protocol, 0, 3) == ("verifier",)
    right = step_outcome(protocol, 0, ACCEPT, 1, 1, 3)  # A is correct and the verifier says so
    wrong = step_outcome(protocol, 0, ACCEPT, 0, 1, 3)
    assert right.done and right.rewards["verifier"] > wrong.rewards["verifier"]
    assert step_outcome(protocol, 0, REJECT, 0, 1, 3).rewards == right.rewards
    assert step_outcome(protocol, 0, None, 1, 1, 3).terminated


def one_pair_in_both_orders(hp: HyperParameters):
    """(protocol, verifier parameters, a test pair correct-first, the same pair swapped)."""
    protocol, params = make_protocol(hp), hp.agents["_default"]
    points = datapoints(load_split(hp, "test"))
    correct_first = next(p for p in points if p.y == 1)
    swapped = next(p for p in points if p.y == 0 and p.other_solution == correct_first.solution)
    return protocol, params, correct_first, swapped


def test_the_prompt_shows_solution_a_then_solution_b():
    protocol, params, correct_first, swapped = one_pair_in_both_orders(hyper())
    for point in (correct_first, swapped):
        prompt = chat_messages(protocol, "verifier", params, point, [], 0, 0)[0]["content"]
        a, b = prompt.index("Solution A is:"), prompt.index("Solution B is:")
        assert a < prompt.index(point.solution, a) < b < prompt.index(point.other_solution, b)
        assert '"Decision: accept" if Solution A is the correct one' in prompt


def test_the_difference_names_each_changed_block_as_a_then_b():
    first = "def f(xs):\n    n = len(xs)\n    return xs[n - 1]\n"
    second = "def f(xs):\n    n = len(xs)\n    return xs[n]\n    # end\n"
    assert solution_difference(first, second) == (
        "At line 3 of Solution A:\nSolution A has:\n    return xs[n - 1]\n"
        "Solution B has:\n    return xs[n]\n    # end"
    )
    assert solution_difference(first, first) == "(the two solutions are the same)"


def test_the_difference_template_shows_solution_a_and_the_lines_b_changes():
    hp = hyper()
    protocol = make_protocol(hp)
    template = Path(__file__).resolve().parent.parent / "configs/templates"
    params = replace(
        hp.agents["_default"],
        system_prompt_template_path=str(template / "pairwise-verifier-difference.j2"),
    )
    point = next(p for p in datapoints(load_split(hp, "test")) if p.y == 0)
    prompt = chat_messages(protocol, "verifier", params, point, [], 0, 0)[0]["content"]
    assert point.solution in prompt and point.other_solution not in prompt
    assert solution_difference(point.solution, point.other_solution) in prompt


def test_likelihood_baseline_picks_the_solution_the_model_finds_likelier():
    base = pd.DataFrame(
        {"datapoint_id": [1, 1, 2, 3], "y": [1, 1, 0, 1], "sample": [0, 1, 0, 0]}
    ).assign(seed=0, arm="base", iteration=0, decision=pd.NA, correct=False, decided=False)
    base = base.assign(model_calls=1, tokens=5, p_accept=0.5)
    scores = pd.DataFrame(
        {
            "datapoint_id": [1, 2],
            "logprob_first": [-10.0, -40.0],  # per token: -1.0 and -4.0
            "tokens_first": [10, 10],
            "logprob_second": [-40.0, -10.0],  # per token: -2.0 and -1.0
            "tokens_second": [20, 10],
        }
    )
    rows = likelihood_rows(base, scores)
    assert set(rows["arm"]) == {LIKELIHOOD_ARM} and 3 not in set(rows["datapoint_id"])
    assert list(rows["decision"]) == [1, 1, 0] and rows["correct"].all()


def test_a_pairwise_experiment_runs_on_the_dummy_backend(prefect_harness, tmp_path: Path):
    folder = run_dummy_pair_experiment("pairwise", tmp_path)
    experiment = pd.read_parquet(folder / "experiment.parquet")
    # every test pair in both orders, for the trained arm and the reference arms alike
    malt = experiment[experiment["arm"] == "malt"]
    assert malt["y"].mean() == 0.5 and len(malt) == 68
    assert set(REFERENCE_ARMS) <= set(experiment["arm"])  # the dummy scores no likelihoods
    summary = pd.read_parquet(folder / "summary.parquet")
    assert {"accuracy_y1", "accuracy_y0"} <= set(summary.columns)
    # no label written into a training row: every verifier answer is a sampled reply
    iteration = folder / "seeds/11/arms/malt/iterations/0000"
    rows = pd.read_parquet(iteration / "datasets/dpo/verifier.parquet")
    nodes = set(pd.read_parquet(iteration / "nodes.parquet")["node_id"])
    assert len(rows) and not rows["guess_replaced"].any()
    assert set(rows["chosen_node_id"]) | set(rows["rejected_node_id"]) <= nodes
    # the training rollouts showed both solutions (the batch file once dropped Solution B)
    train = pd.read_parquet(iteration / "batch.parquet")
    assert train["other_solution"].notna().all()
    for prompt, point_id in zip(rows["prompt"], rows["datapoint_id"], strict=True):
        other = train.loc[train["datapoint_id"] == point_id, "other_solution"].iloc[0]
        shown_b = prompt[0]["content"].split("Solution B is:")[1]
        assert other.strip() and other.strip() in shown_b


def test_best_of_n_ranks_by_pairwise_votes_in_both_orders():
    from nip_core.experiment.best_of_n import (
        ordered_pairs,
        pick_credit,
        round_robin_scores,
        share_solved,
    )

    assert ordered_pairs(3) == [(0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1)]
    # candidate 1 is correct; the verifier says "A" 70 % of the time whatever it sees, plus
    # a small real preference for candidate 1: the bias cancels over both orders
    p = {
        (i, j): 0.7 + (0.05 if i == 1 else 0) - (0.05 if j == 1 else 0) for i, j in ordered_pairs(3)
    }
    scores = round_robin_scores(3, p)
    assert scores.argmax() == 1 and pick_credit(scores, 1) == 1.0
    # a verifier that always says "A" scores every candidate alike: credit 1/N
    flat = round_robin_scores(4, {pair: 1.0 for pair in ordered_pairs(4)})
    assert pick_credit(flat, 2) == 0.25
    assert share_solved([(0, 1), (1, 0)], lambda q: scores) == 0.5
