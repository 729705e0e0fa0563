"""The `balcaprl` command line: thin; it parses arguments and calls into the modules.

Each area registers its own commands (``register(app)``) so this file stays a table of contents.
"""

from __future__ import annotations

from pathlib import Path

import typer

from balcaprl import __version__

app = typer.Typer(
    name="balcaprl",
    help="Balanced RL for image captioners (c-GDPO) and multi-view caption evaluation (b-CapScore).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,  # locals may hold API keys
)
figure_app = typer.Typer(help="Reproduce the paper's figures.", no_args_is_help=True)
app.add_typer(figure_app, name="figure")


@app.command()
def version() -> None:
    """Print the installed balcaprl version."""
    typer.echo(__version__)


@figure_app.command("advantage-collapse")
def advantage_collapse(
    out: Path = typer.Option(..., "--out", help="Folder for advantage_collapse.png and .csv."),
    grid: int = typer.Option(101, min=2, max=1001, help="Grid points per axis over [0, 1]."),
) -> None:
    """Figure 2: rollout 1's advantage under vanilla GRPO (left) and c-GDPO (right)."""
    from balcaprl.figures.advantage_collapse import write_advantage_collapse

    png, csv = write_advantage_collapse(out, grid=grid)
    typer.echo(f"wrote {png}\nwrote {csv}")


def _register_areas() -> None:
    from balcaprl.data.cli import register as register_data
    from balcaprl.demo.cli import register as register_demo
    from balcaprl.evaluate.cli import register as register_evaluate
    from balcaprl.judge.cli import register as register_judge
    from balcaprl.synthetic.cli import register as register_synthetic
    from balcaprl.train.cli import register as register_train
    from balcaprl.train.verl_backend.cli import register as register_export

    register_judge(app)
    register_data(app)
    register_synthetic(app)
    register_train(app)
    register_evaluate(app)
    register_export(app)
    register_demo(app)


_register_areas()

if __name__ == "__main__":
    app()
