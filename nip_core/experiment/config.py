"""An experiment's configuration: one hyper-parameter file plus an `experiment:` section.

    experiment:
      iterations: 2                   # training iterations per arm
      samples_per_test_datapoint: 4   # seeded evaluation episodes per held-out datapoint
      evaluation_split: test          # or "validation" (carved from train) while tuning
      bootstrap_resamples: 2000
      seeds: 5                        # or a list [6198, 11]; a count counts up from `seed`
      parallel_seeds: 2               # seeds side by side, a server each (null: 4 where a
                                      #   CUDA GPU serves them, else 1)
      arms:                           # name -> dotted overrides; malt, label_pairs, ei and
        malt: {}                      #   shuffled_labels are built in
        ei: {}
        shuffled_labels: {}
        malt_all_pairs: {pure_text_malt.pairs_per_parent: all}
        nip:                          # the nip protocol, its verifier starting from the model
          starts_from: malt           #   `malt` ended this seed with (an arm listed earlier)
          interaction_protocol: nip

Every seed re-runs everything (the base evaluation and every arm) with the run seed changed,
which changes the training batch, the rollout sampling and the fine-tune's data order;
`shuffled_labels` is MALT trained on the train split with its labels permuted, the control that
must land at chance.

`starts_from: <arm>` in an arm's overrides starts each of its agents that the named arm also has
from the model that arm ended the seed with (the others from the configured model), so a
protocol's verifier can start from a trained solo verifier (rung (e)); such an arm is also
evaluated before its first iteration (its iteration 0).

Every arm is the shared configuration plus its overrides, so arms share the seed, the data
split and the generation budget (datapoints x K per iteration) unless an arm overrides them.
`ei` runs every iteration as expert iteration with K samples per datapoint and turn, which keeps
its generation budget equal to MALT's. Pure: dicts in, validated hyper-parameters out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from nip_core.parameters import HyperParameters
from nip_core.parameters.loading import apply_overrides

BASE_RUN = "base"
STARTS_FROM = "starts_from"  # an arm's key naming the earlier arm its agents' models start from
SPLITS = ("test", "validation")
_ARM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


@dataclass(frozen=True)
class ExperimentSettings:
    iterations: int = 2
    samples_per_test_datapoint: int = 4
    evaluation_split: str = "test"
    bootstrap_resamples: int = 2000
    seeds: int | list[int] | None = None  # None: the config's own seed only
    parallel_seeds: int | None = None  # seeds run side by side; None: chosen by the machine
    arms: Mapping[str, Mapping[str, object]] = field(default_factory=lambda: {"malt": {}, "ei": {}})


def builtin_overrides(arm: str, iterations: int, hp: HyperParameters) -> dict[str, object]:
    """What the built-in arm names mean (applied before the config's own overrides), each named
    by the signal the verifier trains on:

    - `malt`: MALT as nip defines it, DPO on the verifier's own sampled sibling replies only; no
      label answer is ever written into a training row.
    - `label_pairs`: ours, DPO on "Decision: <true>" over "Decision: <false>" (supervised
      learning with the labels written into the answers; the config's share, else all chats).
    - `shuffled_labels`: the `malt` arm on the train split with its labels permuted.
    - `ei`: expert iteration in every iteration (SFT on the rewarded rollouts, with the config's
      guess replacement).
    """
    malt = {
        "trainer": "pure_text_malt",
        "pure_text_malt.num_initial_ei_iterations": 0,
        "pure_text_malt.verifier_training_signal": "sampled_pairs",
        "text_rl.verifier_guess_replacement_proportion": 0.0,
    }
    if arm == "malt":
        return malt
    if arm == "label_pairs":
        share = hp.text_rl.verifier_guess_replacement_proportion
        return {
            "trainer": "pure_text_malt",
            "pure_text_malt.num_initial_ei_iterations": 0,
            "pure_text_malt.verifier_training_signal": "label_pairs",
            "text_rl.verifier_guess_replacement_proportion": share if share > 0 else 1.0,
        }
    if arm == "shuffled_labels":
        return {**malt, "text_rl.shuffle_training_labels": True}
    if arm == "ei":
        return {
            "trainer": "pure_text_malt",
            "pure_text_malt.num_initial_ei_iterations": iterations,
            "pure_text_ei.num_responses_per_timestep": hp.pure_text_malt.num_responses_per_timestep,
        }
    return {}


def shared_overrides(settings: ExperimentSettings) -> dict[str, object]:
    """What every arm (and the base evaluation) shares: iteration count and evaluation size."""
    return {
        "rl.num_iterations": settings.iterations,
        "rl.num_test_iterations": settings.samples_per_test_datapoint,
        "text_rl.test_on_whole_dataset": True,
        "text_rl.test_scheme": "none",  # the experiment evaluates after every iteration itself
    }


def parse_settings(section: object) -> ExperimentSettings:
    """The `experiment:` section, checked field by field (ValueError naming the field)."""
    if section is None:
        return ExperimentSettings()
    if not isinstance(section, Mapping):
        raise ValueError("'experiment' must be a mapping")
    known = set(ExperimentSettings.__dataclass_fields__)
    unknown = set(section) - known
    if unknown:
        raise ValueError(f"experiment: unknown keys {sorted(unknown)}; known: {sorted(known)}")
    settings = ExperimentSettings(**dict(section))
    for name in ("iterations", "samples_per_test_datapoint", "bootstrap_resamples"):
        value = getattr(settings, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"experiment.{name} must be a positive integer, got {value!r}")
    check_seeds(settings.seeds)
    parallel = settings.parallel_seeds
    if parallel is not None and (
        isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1
    ):
        raise ValueError(
            f"experiment.parallel_seeds must be a positive integer or null, got {parallel!r}"
        )
    if settings.evaluation_split not in SPLITS:
        raise ValueError(
            f"experiment.evaluation_split must be one of {SPLITS}, got "
            f"{settings.evaluation_split!r}"
        )
    arms = settings.arms
    if not isinstance(arms, Mapping) or not arms:
        raise ValueError("experiment.arms must be a non-empty mapping of arm name -> overrides")
    for name, overrides in arms.items():
        if not isinstance(name, str) or not _ARM_NAME.match(name) or name == BASE_RUN:
            raise ValueError(
                f"experiment.arms: bad arm name {name!r} (letters, digits, _ and -; not "
                f"{BASE_RUN!r})"
            )
        if overrides is not None and not isinstance(overrides, Mapping):
            raise ValueError(f"experiment.arms.{name} must be a mapping of dotted key -> value")
    check_starts(arms)
    return settings


def check_starts(arms: Mapping[str, Mapping[str, object] | None]) -> None:
    """Each `starts_from` names an arm listed before its own, which therefore runs first."""
    earlier: list[str] = []
    for name, overrides in arms.items():
        start = (overrides or {}).get(STARTS_FROM)
        if start is not None and (not isinstance(start, str) or start not in earlier):
            raise ValueError(
                f"experiment.arms.{name}.{STARTS_FROM}: {start!r} is not an arm listed before "
                f"{name!r} (listed before it: {earlier})"
            )
        earlier.append(name)


def arm_start(settings: ExperimentSettings, arm: str) -> str | None:
    """The arm whose final models `arm`'s agents start from, if it names one."""
    start = (settings.arms[arm] or {}).get(STARTS_FROM)
    return str(start) if start is not None else None


def samples_alike(
    settings: ExperimentSettings,
    arms: Mapping[str, HyperParameters],
    arm: str,
    earlier: Sequence[str],
) -> list[str]:
    """The `earlier` arms whose rollout calls `arm` may replay: both start from the base models
    (no `starts_from`) with the same agents (models, serving and sampling settings). A call
    replays only where its key matches (prompt, model name, sampling, call seed), so this guards
    what the key does not hold: which weights a model name stands for. A control with its labels
    shuffled then draws exactly `malt`'s first rollouts; only its rewards differ."""
    if arm_start(settings, arm) is not None:
        return []
    return [
        other
        for other in earlier
        if arm_start(settings, other) is None and arms[other].agents == arms[arm].agents
    ]


def start_overrides(models: Mapping[str, str], agents: Sequence[str]) -> list[str]:
    """Overrides starting each of `agents` that `models` (agent -> model) holds from its model."""
    return [f"agents.{agent}.model_name={models[agent]}" for agent in agents if agent in models]


def check_seeds(seeds: object) -> None:
    """`experiment.seeds`: null, a positive count, or a list of distinct integer seeds."""
    if seeds is None:
        return
    if isinstance(seeds, int) and not isinstance(seeds, bool):
        if seeds < 1:
            raise ValueError(f"experiment.seeds must be a positive count or a list, got {seeds}")
        return
    if (
        not isinstance(seeds, list)
        or not seeds
        or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in seeds)
        or len(set(seeds)) != len(seeds)
    ):
        raise ValueError(
            f"experiment.seeds must be a positive count or a list of distinct non-negative "
            f"integers, got {seeds!r}"
        )


def seed_list(settings: ExperimentSettings, config_seed: int) -> list[int]:
    """The seeds to run: the config's seed, a count of seeds from it upwards, or the list."""
    if settings.seeds is None:
        return [config_seed]
    if isinstance(settings.seeds, int):
        return [config_seed + i for i in range(settings.seeds)]
    return list(settings.seeds)


def with_seed(hp: HyperParameters, seed: int) -> HyperParameters:
    """The configuration with its run seed replaced."""
    return apply_overrides(hp, [f"seed={seed}"])


def _as_override_strings(values: Mapping[str, object]) -> list[str]:
    def show(value: object) -> str:
        if value is None:
            return "null"
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value)

    return [f"{key}={show(value)}" for key, value in values.items()]


def arm_hyper_params(
    hp: HyperParameters, settings: ExperimentSettings, arm: str
) -> HyperParameters:
    """The arm's full configuration; ValueError names the arm and the bad override."""
    overrides = (
        builtin_overrides(arm, settings.iterations, hp)
        | shared_overrides(settings)
        | {k: v for k, v in (settings.arms[arm] or {}).items() if k != STARTS_FROM}
    )
    try:
        arm_hp = apply_overrides(hp, _as_override_strings(overrides))
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"experiment arm {arm!r}: {e}") from e
    if arm_hp.rl.num_iterations > settings.iterations:
        raise ValueError(
            f"experiment arm {arm!r}: rl.num_iterations={arm_hp.rl.num_iterations} is more than "
            f"experiment.iterations={settings.iterations} (an arm may run fewer, not more)"
        )
    # Reports read an arm named like the control as the control: one that trains on the true
    # labels would pass for a control that learned (a custom name gets no built-in overrides).
    if arm.startswith("shuffled_labels") and not arm_hp.text_rl.shuffle_training_labels:
        raise ValueError(
            f"experiment arm {arm!r} is named as the shuffled-label control but trains on the true "
            "labels: set text_rl.shuffle_training_labels: true in its overrides, or rename it"
        )
    return arm_hp


def base_hyper_params(hp: HyperParameters, settings: ExperimentSettings) -> HyperParameters:
    """The configuration the base model is evaluated with (no arm overrides)."""
    return apply_overrides(hp, _as_override_strings(shared_overrides(settings)))


def all_arms(hp: HyperParameters, settings: ExperimentSettings) -> dict[str, HyperParameters]:
    """Every arm's configuration, built (and so validated) before anything runs."""
    return {arm: arm_hyper_params(hp, settings, arm) for arm in settings.arms}


def split_config(data: Mapping[str, object]) -> tuple[dict, object]:
    """(hyper-parameter mapping, `experiment` section) of a loaded config file."""
    data = dict(data)
    return data, data.pop("experiment", None)


def settings_with_overrides(section: Mapping, own: Mapping[str, object]) -> dict:
    """The `experiment:` section with `--set experiment.<field>=<value>` applied (values already
    parsed as YAML). `arms=<mapping>` replaces every arm, `arms.<name>=<mapping>` adds or
    replaces one and `arms.<name>=null` drops one, so a rung or a tuning run can pick its arms
    from the command line."""
    known = set(ExperimentSettings.__dataclass_fields__)
    merged = dict(section)
    arms = dict(merged.get("arms", ExperimentSettings().arms) or {})
    for key, value in own.items():
        field_name, dot, arm = key.partition(".")
        if field_name == "arms" and dot:
            if value is None:
                if arm not in arms:
                    raise ValueError(f"--set experiment.arms.{arm}=null: no arm {arm!r}")
                arms.pop(arm)
            else:
                arms[arm] = value
            merged["arms"] = arms
        elif field_name in known and not dot:
            merged[field_name] = value
            if field_name == "arms":
                arms = dict(value) if isinstance(value, Mapping) else value
        else:
            raise ValueError(f"--set experiment.{key}: not a settable field ({sorted(known)})")
    return merged


def experiment_overrides(overrides: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """Split `--set` values into hyper-parameter overrides and `experiment.<field>` ones."""
    plain, own = [], {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if key.startswith("experiment.") and sep:
            own[key.removeprefix("experiment.")] = value
        else:
            plain.append(item)
    return plain, own
