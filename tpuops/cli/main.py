"""The ``tpuops`` command: a thin Typer layer over the library.

``run()`` is the console-script entry point and the in-process entry for tests: it turns
every ``TpuopsError`` into one line on stderr and its exit code, with no traceback.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

import typer

from tpuops.cli import (
    control,
    cost,
    dashboard,
    data,
    doctor,
    emulator,
    init,
    jobs,
    nodes,
    runtime,
    samples,
    schedule,
    sweep,
)
from tpuops.cli.common import CliState, err_console
from tpuops.errors import TpuopsError

# google-api-core warns on every import under Python 3.10, which tpuops supports: not the user's concern.
warnings.filterwarnings("ignore", message="You are using a non-supported Python version", category=FutureWarning)

app = typer.Typer(
    name="tpuops",
    help="Run TensorFlow 2.9 experiments on Cloud TPU VMs: up, train, down, and what it cost.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root(
    ctx: typer.Context,
    config: Path | None = typer.Option(None, "--config", help="Path of tpuops.toml (default: nearest one)."),
) -> None:
    ctx.obj = CliState(config_path=config)


init.register(app)
nodes.register(app)
jobs.register(app)
cost.register(app)
control.register(app)
doctor.register(app)
dashboard.register(app)
sweep.register(app)
schedule.register(app)
app.add_typer(emulator.app, name="emulator")
app.add_typer(runtime.app, name="runtime")
data.app.command("sample")(samples.sample)
app.add_typer(data.app, name="data")


def run(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the exit code instead of raising."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        result = app(args=args, prog_name="tpuops", standalone_mode=False)
    except typer.Exit as done:
        return done.exit_code
    except typer.Abort:
        err_console().print("aborted")
        return 130
    except typer.TyperException as err:  # usage errors: bad flag, missing argument
        err.show()
        return err.exit_code
    except TpuopsError as err:
        err_console().print(f"error: {err}", markup=False, soft_wrap=True, style="red")
        return err.exit_code
    except KeyboardInterrupt:
        err_console().print("interrupted")
        return 130
    return result if isinstance(result, int) else 0


def entry() -> None:
    sys.exit(run())


if __name__ == "__main__":
    entry()
