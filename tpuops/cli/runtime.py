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
    from tpuops.errors import UsageError
    from tpuops.tfenv.locate import candidates, find, read_stamp, require, tensorflow_version

    settings = load_settings(ctx)
    chosen = find(settings)
    rows = [{"source": c.source, "python": str(c.python), "found": c.found, "used": c == chosen}
            for c in candidates(settings)]
    result = {"runtime": str(chosen.python) if chosen else None, "candidates": rows}
    if chosen is not None:
        result["tensorflow"] = tensorflow_version(chosen.python)
        result["stamp"] = read_stamp(chosen.python.parent.parent)
    if as_json:
        print_json(result)
    else:
        print_table("TF 2.9 runtime, in search order", ["source", "python", "found", "used"],
                    [(r["source"], r["python"], "yes" if r["found"] else "no", "<-" if r["used"] else "")
                     for r in rows])
    if chosen is None:
        try:
            require(settings)
        except UsageError as err:
            err_console().print(f"no runtime: {err}", markup=False, soft_wrap=True)
        raise typer.Exit(1)
    if not as_json:
        err_console().print(f"using {chosen.python} (TensorFlow {result['tensorflow'] or 'not installed'})")


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
    from tpuops.tfenv.build import install as build
    from tpuops.tfenv.locate import home_runtime

    venv = path or home_runtime(load_settings(ctx))
    with progress(f"building the TF 2.9 runtime in {venv}", quiet=as_json) as update:
        built = build(venv, force=force, base_python=python, progress=update)
    if as_json:
        print_json({"venv": str(built.venv), "python": str(built.python), "reused": built.reused, **built.stamp})
        return
    verb = "already built" if built.reused else "built"
    err_console().print(f"TF 2.9 runtime {verb}: {built.python} (Python {built.stamp.get('python')}, "
                        f"TensorFlow {built.stamp.get('tensorflow')})")
