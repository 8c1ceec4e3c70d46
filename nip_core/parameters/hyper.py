"""`HyperParameters`: the whole configuration of one experiment.

An experiment is reproducible from this object (up to model-API non-determinism). Sub-parameter
groups may be given as objects, as dicts, or left out (None) to get their defaults.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Literal, Self

import nip_core
from nip_core.parameters.agents import DEFAULT_AGENT, AgentsParameters, PureTextAgentParameters
from nip_core.parameters.base import BaseParameters, build_value, register_parameter_class
from nip_core.parameters.protocol_kinds import CLOSED_REPLY_PROTOCOLS, PAIR_PROTOCOLS
from nip_core.parameters.protocols import (
    CommonProtocolParameters,
    DebateProtocolParameters,
    MnipProtocolParameters,
    NipProtocolParameters,
)
from nip_core.parameters.scenario import CodeValidationParameters, DatasetParameters
from nip_core.parameters.server import ServerParameters
from nip_core.parameters.trainers import (
    PureTextEiParameters,
    PureTextMaltParameters,
    RlTrainerParameters,
    TextRlParameters,
)
from nip_core.parameters.typing_utils import classes_in, field_hints
from nip_core.parameters.versions import (
    PACKAGE_NAME,
    PACKAGE_NAME_KEY,
    PACKAGE_VERSION_KEY,
    convert_hyper_param_dict,
    server_settings_from_agents,
)

ScenarioType = Literal["code_validation"]
TrainerType = Literal["pure_text_ei", "pure_text_malt"]
InteractionProtocolType = Literal[
    "nip",
    "adp",
    "debate",
    "merlin_arthur",
    "mnip",
    "solo_verifier",
    "pairwise",
    "fill_in",
    "fill_in_choice",
]


@register_parameter_class
@dataclass(frozen=True)
class HyperParameters(BaseParameters):
    """The experiment: scenario, trainer, dataset, protocol, seed and every sub-parameter group."""

    scenario: ScenarioType
    trainer: TrainerType
    dataset: str
    interaction_protocol: InteractionProtocolType = "nip"
    seed: int = 6198
    test_size: float = 0.2
    agents: AgentsParameters | dict | None = None
    rl: RlTrainerParameters | dict | None = None
    text_rl: TextRlParameters | dict | None = None
    pure_text_ei: PureTextEiParameters | dict | None = None
    pure_text_malt: PureTextMaltParameters | dict | None = None
    code_validation: CodeValidationParameters | dict | None = None
    dataset_options: DatasetParameters | dict | None = None
    protocol_common: CommonProtocolParameters | dict | None = None
    nip_protocol: NipProtocolParameters | dict | None = None
    debate_protocol: DebateProtocolParameters | dict | None = None
    mnip_protocol: MnipProtocolParameters | dict | None = None
    server: ServerParameters | dict | None = None

    def __post_init__(self) -> None:
        if self.agents is None:
            object.__setattr__(
                self, "agents", AgentsParameters({DEFAULT_AGENT: PureTextAgentParameters()})
            )
        for name, annotation in field_hints(type(self)).items():
            value = getattr(self, name)
            if value is None and (targets := classes_in(annotation, BaseParameters)):
                object.__setattr__(self, name, targets[0]())
            elif isinstance(value, dict):
                object.__setattr__(self, name, build_value(value, annotation))
        super().__post_init__()

    @property
    def shows_pairs(self) -> bool:
        """Whether the protocol's datapoints are two solutions to one question."""
        return self.interaction_protocol in PAIR_PROTOCOLS

    @property
    def draws_closed_replies(self) -> bool:
        """Whether the verifier's reply is drawn from a closed set of texts, not decoded."""
        return self.interaction_protocol in CLOSED_REPLY_PROTOCOLS

    def to_dict(self, include_package_meta: bool = False) -> dict:
        """Nested JSON-ready dict; with `include_package_meta`, also our package name/version.

        Save with the package meta so that later versions know which conversions to apply.
        """
        out = super().to_dict()
        if include_package_meta:
            out[PACKAGE_NAME_KEY] = PACKAGE_NAME
            out[PACKAGE_VERSION_KEY] = nip_core.__version__
        return out

    @classmethod
    def from_dict(cls, params_dict: dict, ignore_extra_keys: bool = False) -> Self:
        """Rebuild from a dict, first upgrading dicts written by older versions (or by nip)."""
        if not isinstance(params_dict, dict):
            raise ValueError(f"HyperParameters needs a dict, got {type(params_dict).__name__}")
        converted = server_settings_from_agents(convert_hyper_param_dict(params_dict))
        converted.pop(PACKAGE_NAME_KEY, None)
        converted.pop(PACKAGE_VERSION_KEY, None)
        return super().from_dict(converted, ignore_extra_keys=ignore_extra_keys)

    def config_hash(self) -> str:
        """Stable sha256 hex digest of what sets this run apart: what differs from the defaults
        (`without_defaults`, sorted keys, no package meta), `rl.num_iterations` aside.

        Adding a setting with a default keeps every run's hash. How many iterations a run has
        says when it stops, not what its iterations are, so a finished run extends by running it
        again with a larger `rl.num_iterations`."""
        settings = self.without_defaults()
        settings["rl"].pop("num_iterations", None)
        return _digest(settings)

    def legacy_config_hash(self) -> str:
        """The hash with `rl.num_iterations` in it, as older run folders' manifests hold it
        (`nip_core.run.run_folder.upgrade_manifest_hashes` rewrites them)."""
        return _digest(self.without_defaults())

    @classmethod
    def construct_test_params(cls) -> Self:
        """A small MALT code-validation run with dummy-API agents."""
        return cls(
            scenario="code_validation",
            trainer="pure_text_malt",
            dataset="humaneval-buggy",
            agents=AgentsParameters.construct_test_params(),
            rl=RlTrainerParameters(num_iterations=2, rollouts_per_iteration=4),
        )


def _digest(settings: dict) -> str:
    text = json.dumps(settings, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
