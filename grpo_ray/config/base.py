"""What every recipe section shares: unknown keys refused, frozen, and the node-targeting fields of a role."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field


class ConfigError(ValueError):
    """A recipe that cannot run. The message is one line naming the field; `lines` holds one such
    line per problem when validation found several (the CLI prints them all)."""

    def __init__(self, message: str, lines: tuple[str, ...] = ()):
        super().__init__(message)
        self.lines = lines or (message,)


class _Section(BaseModel):
    # Unknown keys are typos until proven otherwise; frozen so no layer mutates the recipe at run time.
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, allow_inf_nan=False)


ResourceName = Annotated[str, Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.:/-]+$")]
LabelValue = Annotated[str, Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.-]+$")]


class _RoleSection(_Section):
    # Node targeting: custom Ray resources each worker of this role takes from its node, e.g.
    # {rollout_node: 1} with `ray start --resources '{"rollout_node": 8}'` on the rollout nodes.
    resources: dict[ResourceName, Annotated[float, Field(gt=0)]] = {}
    # Node targeting: labels the node of each worker must carry, e.g. {pool: rollout} with
    # `ray start --labels pool=rollout`.
    node_labels: dict[LabelValue, LabelValue] = {}
