"""Multi-turn environments: tenant Python that answers the model's turns, run sandboxed like
python verifiers. Imports nothing of the web, the database or the queue, and no torch.

Public API (the API's registration and `/test`, the engine's episode rollouts):
`EnvironmentConfig`, `check_source`, `SandboxedEnvironment`, `EnvironmentBudgetExceeded`,
`run_episodes`, `ScriptedPolicy`, `parse_tool_calls`, and the seam's types (`protocol.py`).
"""

from __future__ import annotations

from .config import EnvironmentConfig, SourceInfo, check_source
from .episodes import ScriptedPolicy, run_episodes
from .host import EnvironmentBudgetExceeded, SandboxedEnvironment
from .protocol import (
    EnvironmentSession,
    Episode,
    Message,
    Policy,
    Record,
    StepResult,
    ToolCall,
    ToolError,
)
from .tools import parse_tool_calls

__all__ = [
    "EnvironmentBudgetExceeded",
    "EnvironmentConfig",
    "EnvironmentSession",
    "Episode",
    "Message",
    "Policy",
    "Record",
    "SandboxedEnvironment",
    "ScriptedPolicy",
    "SourceInfo",
    "StepResult",
    "ToolCall",
    "ToolError",
    "check_source",
    "parse_tool_calls",
    "run_episodes",
]
