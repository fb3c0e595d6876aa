"""The ``tpuops`` command: a thin Typer layer over the library.

``run()`` is the console-script entry point and the in-process entry for tests: it turns
every ``TpuopsError`` and every usage error of the parser into one line on stderr and its exit
code, with no traceback (the table of exit codes and streams: docs/cli.md).
"""

from __future__ import annotations

import copy
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

import typer

from tpuops.cli import (
    control,
    cost,
    data,
    doctor,
    emulator,
    init,
    jobs,
    nodes,
    notify,
    profiles,
    risk,
    runtime,
    samples,
    schedule,
    simulate,
    sweep,
)
from tpuops.cli.common import CliState, err_console
from tpuops.core.errors import TpuopsError

# google-api-core warns on every import under Python 3.10, which tpuops supports: not the user's concern.
warnings.filterwarnings("ignore", message="You are using a non-supported Python version", category=FutureWarning)

data.app.command("sample")(samples.sample)


def _print_version(wanted: bool) -> None:
    if wanted:
        from importlib.metadata import version

        sys.stdout.write(f"tpuops {version('tpuops')}\n")
        raise typer.Exit(0)


def _root(
    ctx: typer.Context,
    config: Path | None = typer.Option(None, "--config", help="Path of tpuops.toml (default: nearest one)."),
    _version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                  help="Print the version and exit."),
) -> None:
    ctx.obj = CliState(config_path=config)


def command_line() -> typer.Typer:
    """A Typer app with every command of the CLI; the program (``tpuops/__main__.py``) adds the dashboard's."""
    app = typer.Typer(
        name="tpuops",
        help="Run TensorFlow 2.9 experiments on Cloud TPU VMs: up, train, down, and what it cost.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )
    app.callback()(_root)
    for module in (init, nodes, jobs, cost, risk, simulate, control, doctor, sweep, schedule, profiles):
        module.register(app)
    app.add_typer(emulator.app, name="emulator")
    app.add_typer(runtime.app, name="runtime")
    app.add_typer(notify.app, name="notify")
    app.add_typer(data.app, name="data")
    return app


app = command_line()
"""The CLI's commands, for callers that need no web app (``tpuops.__main__.app`` is the whole program)."""


def run(argv: Sequence[str] | None = None, program: typer.Typer | None = None) -> int:
    """Run the CLI (or ``program``, the CLI composed with more); return the exit code instead of raising."""
    args = list(sys.argv[1:] if argv is None else argv)
    if any("\x00" in arg for arg in args):  # no shell can pass one; a Python caller can, and no path may hold one
        err_console().print("error: an argument contains a NUL byte (\\x00): no name or path can", style="red")
        return 2
    try:
        result = _narrowed(program or app, args)(args=args, prog_name="tpuops", standalone_mode=False)
    except typer.Exit as done:
        return done.exit_code
    except typer.Abort:  # Ctrl-C inside a prompt of click's
        err_console().print("interrupted")
        return 130
    except typer.TyperException as err:  # usage errors: bad flag, missing argument
        err_console().print(_usage_line(err), markup=False, soft_wrap=True, style="red")
        return err.exit_code
    except TpuopsError as err:
        err_console().print(f"error: {err}", markup=False, soft_wrap=True, style="red")
        return err.exit_code
    except KeyboardInterrupt:
        err_console().print("interrupted")
        return 130
    return result if isinstance(result, int) else 0


def _narrowed(program: typer.Typer, args: Sequence[str]) -> typer.Typer:
    """``program`` with only the command (or group) that ``args`` begin with, else ``program`` itself.

    Typer turns every command's signature into click parameters before it parses a word, a thirtieth
    of a second for all of them, while parsing needs only the command being run; its help and its
    errors read nothing else. Whatever does need the others (no command, a root option first, a name
    no command has, which click answers with the names it knows) gets the whole program.
    """
    from typer.main import get_command_name

    if not args or not all(isinstance(group.name, str) for group in program.registered_groups):
        return program
    commands = [command for command in program.registered_commands
                if (command.name or get_command_name(getattr(command.callback, "__name__", ""))) == args[0]]
    groups = [group for group in program.registered_groups if group.name == args[0]]
    if not commands and not groups:
        return program
    narrow = copy.copy(program)
    narrow.registered_commands, narrow.registered_groups = commands, groups
    return narrow


def _usage_line(err: typer.TyperException) -> str:
    """Click's usage error as one line: what is wrong, and where the right forms are listed."""
    message = " ".join(err.format_message().split())
    context = getattr(err, "ctx", None)
    where = f" (see '{context.command_path} --help')" if context is not None else ""
    return f"error: {message}{where}"


if __name__ == "__main__":
    sys.exit(run())
