"""TRL's pairwise DPO loss names, shared by the configuration and the server's training options.

An NLL ("sft") term on the chosen answer is added through `dpo_rpo_alpha` instead of a name here.
"""

from typing import Literal

DpoLossType = Literal[
    "sigmoid",
    "hinge",
    "ipo",
    "exo_pair",
    "nca_pair",
    "robust",
    "bco_pair",
    "sppo_hard",
    "aot",
    "aot_unpaired",
    "apo_zero",
    "apo_down",
    "discopop",
    "sigmoid_norm",
]
LOSS_TYPES: tuple[str, ...] = DpoLossType.__args__
