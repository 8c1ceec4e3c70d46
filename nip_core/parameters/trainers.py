"""Trainer parameters: the shared RL loop, text-RL options, Expert Iteration and MALT."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from nip_core.parameters.base import BaseParameters, register_parameter_class


@register_parameter_class
@dataclass(frozen=True)
class RlTrainerParameters(BaseParameters):
    """The outer training loop.

    Our defaults are sized for API-based text training: nip's tensor-RL defaults
    (1000 iterations, 1000 frames per batch, ten whole-test-set passes) would cost a fortune in
    model calls, so we use 8 iterations of 20 rollouts and one test pass.
    """

    num_iterations: int = 8
    rollouts_per_iteration: int = 20
    num_test_iterations: int = 1
    num_epochs: int = 1
    learning_rate: float = 1e-5


@register_parameter_class
@dataclass(frozen=True)
class TextRlParameters(BaseParameters):
    """Options shared by the text trainers (EI and MALT).

    `max_concurrent_requests` caps simultaneous model calls; `rollout_shard_size` is the number
    of datapoints per checkpointed generation shard, `validation_fraction` the share of the
    train split's problems set aside (never trained on) for sweeps and the switch guard. With
    `switch_guard`, a fine-tuned model replaces the previous one only if its mean episode reward
    on `switch_guard_episodes` validation episodes is not lower by more than
    `switch_guard_margin` (nip has no guard), and its replies on those episodes are not less
    likely, under the previous model, than the previous model's own by more than
    `switch_guard_max_drift` nats per token (None: no such check; self-hosted models only),
    and its decided verdicts on those episodes are not `switch_guard_max_verdict_share` or more
    one answer while the episodes' labels are mixed (None: no such check): a verifier that
    answers one verdict every time must not be switched in. `switch_guard_balance_labels` draws
    the guard's episodes as many from correct as from buggy solutions (else a seeded draw of
    the validation split, whose share of either label varies: 11 of 16 correct ones judged a
    model that leans to "reject" worse than the base on one test seed).
    `shuffle_training_labels` permutes the labels of the train split (never validation or test)
    before anything trains: the control arm that must land at chance. With
    `balance_verifier_by_label` its verifier pairs are balanced by shown and true label, so as
    many agree with the truth as disagree (a permutation alone does not ensure it). All of these are ours, not
    nip's.
    """

    fine_tune_on_all_previous_rollouts: bool = False
    verifier_guess_replacement_proportion: float = 0.0
    verifier_guess_replacement_annealing: Literal["none", "linear", "exponential"] = "none"
    verifier_guess_replacement_annealing_rate: float = 0.1
    test_scheme: Literal["none", "all", "last", "first_and_last"] = "none"
    test_on_whole_dataset: bool = True
    max_concurrent_requests: int = 32
    rollout_shard_size: int = 8
    validation_fraction: float = 0.0
    switch_guard: bool = False
    switch_guard_episodes: int = 32
    switch_guard_margin: float = 0.05
    switch_guard_max_drift: float | None = 2.0
    switch_guard_max_verdict_share: float | None = 0.9
    switch_guard_balance_labels: bool = False
    shuffle_training_labels: bool = False


@register_parameter_class
@dataclass(frozen=True)
class PureTextEiParameters(BaseParameters):
    """Expert Iteration: which rollouts each agent is fine-tuned on.

    `num_responses_per_timestep` is ours: nip samples one response per turn in EI; K > 1 grows
    EI trees like MALT's (K samples per datapoint and turn), so an EI arm can be given the same
    generation budget as a MALT arm.
    """

    rollout_selection_method: Literal["threshold", "weighted_sampling"] = "threshold"
    reward_threshold: float = 0.9
    weighting_sample_size_factor: float = 0.5
    weighting_minimum: float | None = None
    weighting_use_replacement: bool = True
    weighting_epsilon: float = 0.01
    num_responses_per_timestep: int = 1


@register_parameter_class
@dataclass(frozen=True)
class PureTextMaltParameters(BaseParameters):
    """Multi-Agent LLM Training: response trees and DPO preference pairs.

    `expected_reward_estimator` is ours: "monte_carlo" (a node's step reward plus the mean of
    its children's values) or nip's "leaf_average" (subtree reward over its leaf count).
    `pairs_per_parent` is ours too: "one" (nip) picks at most one pair per (parent, agent);
    "all" takes every sibling pair the method's rule accepts, each once, for more training
    signal from the same trees.

    `verifier_training_signal` names what the verifier's DPO rows are (ours; provers always
    train on their sampled pairs): "sampled_pairs" (nip's MALT: two of the verifier's own
    sampled sibling replies, the one with the higher expected reward chosen; no row holds text
    we wrote), "label_pairs" (ours: "Decision: <true>" over "Decision: <false>" after a share
    `text_rl.verifier_guess_replacement_proportion` of its chats, label-balanced; supervised
    learning, not MALT) or "sampled_and_label_pairs" (both). `balance_verifier_by_label` (ours)
    keeps as many of the verifier's sampled pairs (MALT iterations) or rewarded rollouts (the
    expert-iteration warm start, `num_initial_ei_iterations`) from problems with correct code
    as from problems with buggy code, a seeded draw from the larger side: a base verifier that
    mostly accepts yields many "accept on correct code" rows and few "reject on buggy code"
    ones, and training on that imbalance teaches "accept". `balance_spares_settled_labels`
    (ours) leaves out of that count a label on which every rollout already ended in the right
    verdict: it gives no pairs because there is nothing to correct, and the other label's pairs
    are kept rather than all dropped (a `nip` verifier that rejects every buggy solution but
    decides on only some correct ones).

    `training_objective` (ours) is what MALT iterations train on: "dpo" (nip: preference pairs)
    or "kto", a group-relative objective on the same trees: each sampled reply whose expected
    reward is above its siblings' mean is a desirable answer, below it an undesirable one, up to
    `kto_rows_per_parent` of them per parent and agent (half of each kind where there are
    enough), trained by TRL's KTO on our self-hosted server (the OpenAI API has no KTO); the
    verifier's rows are balanced by label like its pairs.

    `rollout_temperature` (ours) samples the training rollouts at that temperature instead of
    each agent's own (None); evaluations and the switch guard keep the agent's. A pair needs
    both outcomes among a parent's K samples: a model sure of its answer gives none, wrong or
    right, and a hotter draw reaches the questions it is wrongly sure of. A decoded reply takes
    the OpenAI API's 0-2; a reply drawn from a closed set (`fill_in_choice`) takes up to 100.

    `rollout_early_verdict_retries` (ours; needs `early_decision_ends_episode`) re-samples, in
    training rollouts only, a verifier's verdict given before it may decide, up to that many
    times, keeping the first sample that is a move and no verdict. A verifier that judges some
    code at once then still reaches the rounds where a verdict counts on it, so label pairs and
    their first-turn counterparts exist for that code too. Evaluations and the guard keep every
    early verdict as drawn.
    """

    num_responses_per_timestep: int = 2
    frozen_agents_generate_one_response: bool = True
    pair_selection_method: Literal["positive_negative", "interval"] = "positive_negative"
    interval_threshold_proportion: float = 0.1
    num_initial_ei_iterations: int = 0
    expected_reward_estimator: Literal["monte_carlo", "leaf_average"] = "monte_carlo"
    pairs_per_parent: Literal["one", "all"] = "one"
    verifier_training_signal: Literal["sampled_pairs", "label_pairs", "sampled_and_label_pairs"] = (
        "sampled_pairs"
    )
    balance_verifier_by_label: bool = False
    balance_spares_settled_labels: bool = False
    training_objective: Literal["dpo", "kto"] = "dpo"
    kto_rows_per_parent: int = 2
    rollout_temperature: float | None = None
    rollout_early_verdict_retries: int = 0

    @property
    def trains_on_sampled_verifier_pairs(self) -> bool:
        return self.verifier_training_signal in ("sampled_pairs", "sampled_and_label_pairs")

    @property
    def trains_on_label_pairs(self) -> bool:
        return self.verifier_training_signal in ("label_pairs", "sampled_and_label_pairs")
