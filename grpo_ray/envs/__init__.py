"""Environments: what an agent's episode talks to between its turns (pure: no Ray, engine or DeepSpeed).

contract.py    the environment contract a user writes (reset, step, reward) and tool sets
               (public methods as tools, TRL's environment_factory classes unchanged)
tools.py       a tool's JSON schema from its signature and docstring
tool_calls.py  the model's tool calls read from its text (the chat template's tool format)
episode.py     one episode's tokens: the model's (trained on) and everything else (context)
failures.py    an environment's failures named and counted per kind, and the run's watch over them
runner.py      the environment's processes, each request with a hard timeout
"""

from grpo_ray.envs.contract import Environment, StepResult, ToolEnvironment

__all__ = ["Environment", "StepResult", "ToolEnvironment"]
