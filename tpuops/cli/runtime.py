"""``tpuops runtime``: the local TF 2.9 runtime that provider=local runs jobs with (status, install)."""

from __future__ import annotations

from pathlib import Path

import typer

from tpuops.cli.common import JSON, err_console, load_settings, print_json, print_table, progress

app = typer.Typer(help="The local TF 2.9 runtime (Python 3.8-3.10 venv) that provider=local runs jobs with.",
                  no_args_is_help=True)


@app.command("status")
def show_status(ctx: typer.Context, as_json: bool = JSON) -> None:
    """The search order (tf_python, $TPUOPS_HOME/runtime/tf29, the checkout's .venv-tf29); exit 1 if none is there."""
    from tpuops import api

    found = api.runtime_status(load_settings(ctx))
    result = found.to_json()
    rows = result["candidates"]
    if as_json:
        print_json(result)
    else:
        print_table("TF 2.9 runtime, in search order", ["source", "python", "found", "used"],
                    [(r["source"], r["python"], "yes" if r["found"] else "no", "<-" if r["used"] else "")
                     for r in rows])
    if found.chosen is None:
        err_console().print(f"no runtime: {found.missing}", markup=False, soft_wrap=True)
        raise typer.Exit(1)
    if not as_json:
        err_console().print(f"using {found.chosen.python} (TensorFlow {found.tensorflow or 'not installed'})")


@app.command("install")
def install(
    ctx: typer.Context,
    path: Path | None = typer.Option(None, help="Where to build the venv (default: $TPUOPS_HOME/runtime/tf29)."),
    python: str | None = typer.Option(None, help="Interpreter to build with (default: Python 3.8, 3.9 or 3.10 "
                                                 "found on PATH, under pyenv or through uv)."),
    force: bool = typer.Option(False, "--force", help="Rebuild even if a runtime of the same pins is there."),
    as_json: bool = JSON,
) -> None:
    """Build the TF 2.9 runtime from the packaged pin file (a no-op when it is built already)."""
    from tpuops import api

    with progress("building the TF 2.9 runtime", quiet=as_json) as update:
        built = api.runtime_install(load_settings(ctx), path=path, force=force, base_python=python, progress=update)
    if as_json:
        print_json({"venv": str(built.venv), "python": str(built.python), "reused": built.reused, **built.stamp})
        return
    verb = "already built" if built.reused else "built"
    err_console().print(f"TF 2.9 runtime {verb}: {built.python} (Python {built.stamp.get('python')}, "
                        f"TensorFlow {built.stamp.get('tensorflow')})")
