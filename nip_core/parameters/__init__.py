"""The configuration API: nested, validated, serialisable experiment parameters.

    from nip_core.parameters import HyperParameters
    params = HyperParameters(scenario="code_validation", trainer="pure_text_malt",
                             dataset="humaneval-buggy", rl={"num_iterations": 4})
    params.get("agents.verifier.lora_rank")          # 64, via the "_default" agent
    HyperParameters.from_dict(params.to_dict()) == params

Load from YAML/JSON with dotted overrides via `load_hyper_params(path, ["rl.num_iterations=2"])`.
"""

from nip_core.parameters.agents import (
    DEFAULT_AGENT,
    AgentParameters,
    AgentsParameters,
    PureTextAgentParameters,
)
from nip_core.parameters.base import (
    BaseParameters,
    ParameterValue,
    parameter_class,
    register_parameter_class,
)
from nip_core.parameters.hyper import (
    HyperParameters,
    InteractionProtocolType,
    ScenarioType,
    TrainerType,
)
from nip_core.parameters.loading import (
    apply_overrides,
    load_hyper_params,
    read_params_file,
    save_hyper_params,
)
from nip_core.parameters.protocols import (
    CommonProtocolParameters,
    DebateProtocolParameters,
    MnipProtocolParameters,
    NipProtocolParameters,
)
from nip_core.parameters.reference import REFERENCE_CLASSES, UNSUPPORTED_REFERENCE_CLASSES
from nip_core.parameters.scenario import CodeValidationParameters, DatasetParameters
from nip_core.parameters.server import ServerParameters
from nip_core.parameters.trainers import (
    PureTextEiParameters,
    PureTextMaltParameters,
    RlTrainerParameters,
    TextRlParameters,
)
from nip_core.parameters.versions import convert_hyper_param_dict, register_conversion

SubParameters = BaseParameters  # nip's name for the base of sub-parameter groups

__all__ = [
    "DEFAULT_AGENT",
    "AgentParameters",
    "AgentsParameters",
    "BaseParameters",
    "CodeValidationParameters",
    "CommonProtocolParameters",
    "DatasetParameters",
    "DebateProtocolParameters",
    "HyperParameters",
    "InteractionProtocolType",
    "MnipProtocolParameters",
    "NipProtocolParameters",
    "ParameterValue",
    "PureTextAgentParameters",
    "PureTextEiParameters",
    "PureTextMaltParameters",
    "REFERENCE_CLASSES",
    "RlTrainerParameters",
    "ServerParameters",
    "ScenarioType",
    "SubParameters",
    "TextRlParameters",
    "TrainerType",
    "UNSUPPORTED_REFERENCE_CLASSES",
    "apply_overrides",
    "convert_hyper_param_dict",
    "load_hyper_params",
    "parameter_class",
    "read_params_file",
    "register_conversion",
    "register_parameter_class",
    "save_hyper_params",
]
