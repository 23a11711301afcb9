"""The SDK for writing tollgate policies in Python.

A policy is a WebAssembly component of the ``tollgate:policy/policy@0.3.0`` world, built by
``tollgate policy build`` with componentize-py. It decides; the host reserves. Subclass
:class:`Policy` in the project's ``app.py`` as a class named ``Decide``: every method has the
standard rules as its default, so a policy overrides only what it changes.

The types are those componentize-py generates from the world (``wit_world``), re-exported
here under the names the docs use; ``host`` is the host's imports.
"""

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import host
from wit_world.imports.types import (
    Admission,
    Admission_Admit,
    Admission_Refuse,
    BucketKind,
    BucketLevel,
    Failure,
    Failure_AuthFailed,
    Failure_BadRequest,
    Failure_ConnectFailed,
    Failure_ContentFiltered,
    Failure_Other,
    Failure_RateLimited,
    Failure_Unavailable,
    FailureReport,
    GiveUpReason,
    LogLevel,
    Plan,
    PolicyInfo,
    Priority,
    Refusal,
    RefusalReason,
    Request,
    RetryDecision,
    RetryDecision_GiveUp,
    RetryDecision_Retry,
    Route,
    SlotLevel,
    SlotScope,
)

from . import standard
from .standard import degrade


def admit(plan: Plan) -> Admission:
    """An admission with this plan."""
    return Admission_Admit(plan)


def refuse(reason: RefusalReason, retry_after_ms=None) -> Admission:
    """A refusal for ``reason``, with the policy's estimate of when waiting cures it."""
    return Admission_Refuse(Refusal(reason, retry_after_ms))


def retry(not_before_ms: int) -> RetryDecision:
    """Retry no earlier than this logical time (ms)."""
    return RetryDecision_Retry(not_before_ms)


def give_up(reason: GiveUpReason) -> RetryDecision:
    """No retry, for ``reason``."""
    return RetryDecision_GiveUp(reason)


def log(level: LogLevel, message: str) -> None:
    """A line for the host's log (at most 8 per call, 1 KiB each; more are dropped)."""
    host.log(level, message)


class Policy(exports.Decide):
    """A policy: the standard rules unless a method is overridden.

    ``describe`` returns ``NAME``/``VERSION``; ``self_check`` raises ``ValueError`` (or
    returns a message) to refuse activation.
    """

    NAME = "python-policy"
    VERSION = "0.1.0"

    def describe(self) -> PolicyInfo:
        return PolicyInfo(self.NAME, self.VERSION)

    def self_check(self) -> None:
        problem = self.check()
        if problem is not None:
            raise Err(problem)

    def check(self):
        """``None`` when the parameters make sense, else what is wrong."""
        return standard.self_check()

    def admit(self, req: Request) -> Admission:
        return standard.admit(req)

    def on_failure(self, report: FailureReport) -> RetryDecision:
        return standard.on_failure(report)


__all__ = [name for name in dir() if not name.startswith("_")]
