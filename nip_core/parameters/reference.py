"""The parameter class names nip (the reference library) writes, and which of ours they load as.

nip's `to_dict()` tags every sub-parameter dict with `"_type": <nip class name>` and
`HyperParameters.to_dict(include_package_meta=True)` adds `"_package_name": "nip"` and
`"_package_version"`. For the pure-text code-validation scenario the names below are all it
writes; `HyperParameters.from_dict` (and so `load_hyper_params`) accepts each of them.

Most names are the same as ours. The differences:

* `CodeValidationAgentParameters` (nip's code-validation agent, a subclass of its
  `PureTextAgentParameters` that adds no fields) loads as our `PureTextAgentParameters`.
* `PvgProtocolParameters` (nip before 1.0) loads as `NipProtocolParameters`.

Whole sections nip writes for tensor scenarios and trainers (`ppo`, `vanilla_ppo`, `spg`,
`reinforce`, `solo_agent`, `image_classification`, `zk_protocol`, `message_regression`,
`base_run`: classes `CommonPpoParameters`, `VanillaPpoParameters`, `SpgParameters`,
`ReinforceParameters`, `SoloAgentParameters`, `ImageClassificationParameters`,
`ZkProtocolParameters`, `MessageRegressionParameters`, `BaseRunParameters`) are dropped, with a
warning, by the version conversion in `versions.py` before any `_type` is resolved. nip classes
for values we do not implement (random, graph and image agents) fail with an error naming the
class and the reason; any other unknown name fails as unknown. nip's agent fields for tensor
agents and checkpoints (`update_schedule`, `agent_lr_factor`, ...) and the classes they hold
(`ConstantUpdateSchedule`, `LrFactors`) are dropped when they hold nip's defaults and refused
otherwise (`versions.without_nip_agent_settings`).
"""

from __future__ import annotations

from nip_core.parameters.agents import AgentsParameters, PureTextAgentParameters
from nip_core.parameters.base import (
    ParameterValue,
    register_parameter_alias,
    register_unsupported_parameter_class,
)
from nip_core.parameters.hyper import HyperParameters
from nip_core.parameters.protocols import (
    CommonProtocolParameters,
    DebateProtocolParameters,
    MnipProtocolParameters,
    NipProtocolParameters,
)
from nip_core.parameters.scenario import CodeValidationParameters, DatasetParameters
from nip_core.parameters.trainers import (
    PureTextEiParameters,
    PureTextMaltParameters,
    RlTrainerParameters,
    TextRlParameters,
)

REFERENCE_PACKAGE_NAME = "nip"

#: nip class name (as written in `_type`) -> the class of ours it loads as.
REFERENCE_CLASSES: dict[str, type[ParameterValue]] = {
    # the whole experiment
    "HyperParameters": HyperParameters,
    # agents, the agents container and agent values
    "CodeValidationAgentParameters": PureTextAgentParameters,
    "PureTextAgentParameters": PureTextAgentParameters,
    "AgentsParameters": AgentsParameters,
    # protocols
    "CommonProtocolParameters": CommonProtocolParameters,
    "NipProtocolParameters": NipProtocolParameters,
    "PvgProtocolParameters": NipProtocolParameters,
    "DebateProtocolParameters": DebateProtocolParameters,
    "MnipProtocolParameters": MnipProtocolParameters,
    # trainers
    "RlTrainerParameters": RlTrainerParameters,
    "TextRlParameters": TextRlParameters,
    "PureTextEiParameters": PureTextEiParameters,
    "PureTextMaltParameters": PureTextMaltParameters,
    # scenario and dataset
    "CodeValidationParameters": CodeValidationParameters,
    "DatasetParameters": DatasetParameters,
}

_NOT_TEXT = "only the pure-text code-validation scenario is implemented"

#: nip class names we recognise but cannot load, with the reason given in the error.
UNSUPPORTED_REFERENCE_CLASSES: dict[str, str] = {
    "RandomAgentParameters": "random agents are not implemented (text agents only)",
    "GraphIsomorphismAgentParameters": _NOT_TEXT,
    "ImageClassificationAgentParameters": _NOT_TEXT,
}

for _name, _cls in REFERENCE_CLASSES.items():
    register_parameter_alias(_name, _cls)
for _name, _reason in UNSUPPORTED_REFERENCE_CLASSES.items():
    register_unsupported_parameter_class(_name, _reason)
