"""The ``RunsCommands`` capability: live access to a node's workers (``tpuops exec``), which a provider may lack.

A provider that can run a command on one worker of one of its nodes implements ``RunsCommands`` beside
``NodeProvider`` (as ``StartsNodes`` and ``QueuesNodes`` are separate protocols in ``base``); the front door asks
``commands_of(provider)`` and refuses in one line (``UsageError``) when the provider has none. Cloud TPU reaches
its workers with ``gcloud compute tpus tpu-vm ssh`` (``cloud_tpu``), the local emulator's workers are local
processes (``tpuops.session``). Per-worker *logs* are not part of it: every worker ships its own log to the
run's store (``runs/<run>/logs/w<N>/``), which any provider's runs can read.

The contract, for every implementation:

- ``argv`` reaches the worker as the same arguments, each exactly as given: an implementation that must hand a
  shell one command line quotes them once for that shell (``command_line``), never joins them with spaces;
- the command's own exit status comes back as ``WorkerRan.code`` (a command killed by signal N is 128 + N, as a
  shell reports it); a non-zero exit is an answer, not an error;
- nothing is asked of any other worker, and nothing reads standard input.

Standard library only, so the protocol costs a command that does not use it nothing.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from tpuops.core.errors import Timeout, UsageError


@dataclass(frozen=True)
class WorkerRan:
    """What one worker gave back for a command: its exit code and output."""

    worker: int
    code: int
    stdout: str
    stderr: str

    def to_json(self) -> dict[str, Any]:
        return {"worker": self.worker, "code": self.code, "stdout": self.stdout, "stderr": self.stderr}


@runtime_checkable
class RunsCommands(Protocol):
    """Runs a command on one worker of a READY node and returns what it did (module docstring: the contract)."""

    def run_on_worker(self, zone: str, node: str, worker: int, argv: Sequence[str], *,
                      timeout_s: float) -> WorkerRan:
        """Run ``argv`` on worker ``worker`` of node ``node`` in ``zone`` and wait for it.

        Args:
            zone: the node's zone.
            node: the node's name.
            worker: which host of the node, 0 up to its host count (the caller checked the range).
            argv: the program and its arguments, at least one; each reaches the worker exactly as given.
            timeout_s: how long the command may run.

        Returns:
            The worker's exit code (the command's, or the transport's own failure code, e.g. ssh's 255),
            standard output and standard error.

        Raises:
            UsageError: the tool that reaches workers is not installed, or the node or worker is not there.
            Timeout: the command ran past ``timeout_s`` (it is killed).
        """
        ...


def commands_of(provider: object, name: str) -> RunsCommands:
    """``provider``'s ``RunsCommands``; ``UsageError``, one line naming the provider ``name``, when it has none."""
    if not isinstance(provider, RunsCommands):
        raise UsageError(f"node provider {name!r} cannot reach its nodes' workers, so 'exec' cannot run there "
                         f"(the cloud-tpu provider can: gcloud ssh, or the local emulator's workers)")
    return provider


def command_line(argv: Sequence[str]) -> str:
    """``argv`` as one line for a POSIX shell to parse back into exactly ``argv`` (``shlex.split`` does)."""
    return shlex.join(argv)


def run_here(worker: int, argv: Sequence[str], *, cwd: str | None = None, env: dict[str, str] | None = None,
             timeout_s: float) -> WorkerRan:
    """Run ``argv`` as a process of this machine (no shell) for worker ``worker``; what ``run_on_worker`` returns.
    Output that is not UTF-8 (a binary file printed) comes back with U+FFFD for the bytes it cannot decode.

    Raises:
        UsageError: ``argv[0]`` is not installed.
        Timeout: it ran past ``timeout_s`` (``subprocess.run`` kills it).
    """
    import subprocess

    try:
        done = subprocess.run(list(argv), cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                              encoding="utf-8", errors="replace", timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise Timeout(f"worker {worker}: the command ran past {timeout_s:.0f} s") from None
    except FileNotFoundError as err:
        raise UsageError(f"{argv[0]} is not installed: {err.strerror}") from None
    code = done.returncode if done.returncode >= 0 else 128 - done.returncode
    return WorkerRan(worker, code, done.stdout, done.stderr)
