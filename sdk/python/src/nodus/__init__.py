"""Nodus from Python: run Claude agents as durable, cost-capped runs on a Nodus server.

.. code-block:: python

    import nodus

    agent = nodus.ClaudeAgent("helper", system="You are careful.", families=["haiku", "sonnet"])
    print(agent.remote("Use the shell to print the Python version"))

The server and token come from the arguments of :class:`Client`, else ``NODUS_SERVER`` /
``NODUS_TOKEN`` / ``NODUS_PROJECT``, else the ``nodus`` CLI's current context. The asyncio
client with the same surface is :mod:`nodus.aio`.
"""

from __future__ import annotations

from .agents import AgentEnvironment, AgentGroup, AgentRun, ClaudeAgent
from .client import Client, default_client
from .config import Connection, resolve
from .errors import (
    AgentRunFinished,
    AgentStopped,
    AlreadyExists,
    ConfigError,
    Conflict,
    ConnectionFailed,
    Forbidden,
    InternalError,
    Invalid,
    NodusError,
    NotFound,
    RunFailed,
    ServerUnavailable,
    Unauthorized,
    WaitTimeout,
    WorkdirNotKept,
)
from .types import (
    Cost,
    Delivery,
    EgressRecord,
    EnvironmentSpec,
    Evaluation,
    GroupStatus,
    LogLine,
    PostRunActionInfo,
    Result,
    RunError,
    RunRecord,
    RunResult,
    RunStatus,
    SecretRef,
    Step,
    Task,
    Turn,
)

__version__ = "0.1.0"

__all__ = [
    "ClaudeAgent",
    "AgentRun",
    "AgentGroup",
    "AgentEnvironment",
    "Task",
    "Client",
    "default_client",
    "Connection",
    "resolve",
    "RunStatus",
    "GroupStatus",
    "Evaluation",
    "Result",
    "Step",
    "Delivery",
    "Cost",
    "Turn",
    "EnvironmentSpec",
    "SecretRef",
    "RunResult",
    "RunRecord",
    "EgressRecord",
    "RunError",
    "LogLine",
    "PostRunActionInfo",
    "NodusError",
    "ConfigError",
    "Unauthorized",
    "Forbidden",
    "NotFound",
    "WorkdirNotKept",
    "Invalid",
    "Conflict",
    "AlreadyExists",
    "AgentRunFinished",
    "AgentStopped",
    "ServerUnavailable",
    "ConnectionFailed",
    "InternalError",
    "WaitTimeout",
    "RunFailed",
]
