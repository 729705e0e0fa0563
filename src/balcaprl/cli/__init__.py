"""The `balcaprl` command line, grouped by what a user is doing.

This file is the table of contents (which command lives where, in which help panel) and the one
error boundary; each activity's commands live in a module of their own (``cli/data.py``,
``cli/train.py``, ...). Command modules import the heavy libraries (torch, transformers, openai,
pyarrow) inside the command bodies, so ``balcaprl --help`` starts in a fraction of a second.

The help is click's plain text (``rich_markup_mode=None``): at 80 columns rich's option table cut
flag names to ``--official-deca…`` and showed switches with a ``<bool>`` value; plain text gives
each flag its whole name and shows a value only for options that take one. The root help keeps
the activity panels as sections.

The error boundary: a :class:`~balcaprl.errors.UserError` escaping any command is printed as one
line, ``error: <message>``, on stderr (plain text: never wrapped at the console width) and the exit
status is 2, as for typer's own usage errors. An ``OSError`` (a full disk, an I/O error: the system
refused a read or a write mid-run) is one line too, ``error: <path>: <reason>; ...``, status 1; Ctrl-C
is one line, ``interrupted; ...``, status 130. ``--debug`` (or ``BALCAPRL_DEBUG=1``) lets them through
with their tracebacks. Anything else is a bug and keeps its traceback; typer's pretty tracebacks never
show local variables, which may hold API keys.
"""

from __future__ import annotations

import contextlib
import copy
import sys
import textwrap

import typer
from typer.core import TyperGroup

from balcaprl import __version__
from balcaprl.cli import data, demo, evaluate, figure, inspect, judge, synthetic, train, verl
from balcaprl.cli.common import (
    INTERRUPTED_STATUS,
    SYSTEM_ERROR_STATUS,
    interrupted_line,
    plain_help_types,
    quiet_abandoned_tasks,
    system_error,
    system_error_line,
)
from balcaprl.errors import UserError
from balcaprl.files import SHOWN_ERRORS
from balcaprl.outputs import release_output_locks

__all__ = ["app"]

DEBUG_ENV = "BALCAPRL_DEBUG"
PANELS = ("Demo", "Data", "Judge", "Train", "Evaluate", "Paper")  # the help's sections, in this order


class RootGroup(TyperGroup):
    """The root command group: the error boundary (every command runs inside :meth:`invoke`) and the
    order of the help's activity panels (typer would list plain commands before groups)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        plain_help_types(self)  # FILE, TEXT, INTEGER in the help, not <list[str]>

    def list_commands(self, ctx: typer.Context) -> list[str]:
        rank = {panel: i for i, panel in enumerate(PANELS)}
        names = super().list_commands(ctx)
        return sorted(names, key=lambda name: rank.get(self.commands[name].rich_help_panel, len(rank)))

    def format_commands(self, ctx: typer.Context, formatter) -> None:
        """One help section per activity panel (click would list every command under "Commands")."""
        commands = [(name, self.get_command(ctx, name)) for name in self.list_commands(ctx)]
        commands = [
            (name, command) for name, command in commands if command is not None and not command.hidden
        ]
        if not commands:
            return
        limit = formatter.width - 6 - max(len(name) for name, _ in commands)
        for panel in dict.fromkeys(command.rich_help_panel or "Commands" for _, command in commands):
            rows = [
                (name, command.get_short_help_str(limit))
                for name, command in commands
                if (command.rich_help_panel or "Commands") == panel
            ]
            with formatter.section(panel):
                formatter.write_dl(rows)

    def invoke(self, ctx: typer.Context):
        for stream in (sys.stdout, sys.stderr):  # a path with a byte that is not UTF-8 prints as \xff
            with contextlib.suppress(AttributeError, ValueError):
                stream.reconfigure(errors=SHOWN_ERRORS)
        try:
            return super().invoke(ctx)
        except UserError as error:
            if ctx.params.get("debug"):
                raise
            typer.echo(f"error: {error}", err=True)  # plain text: no console width, no wrapping
            ctx.exit(2)
        except KeyboardInterrupt:  # Ctrl-C: one line, the shell's status for it, no stack
            if ctx.params.get("debug"):
                raise
            typer.echo(interrupted_line(), err=True)
            quiet_abandoned_tasks()
            ctx.exit(INTERRUPTED_STATUS)
        except Exception as error:  # a disk full, an I/O error: the system's refusal, not a bug
            refused = system_error(error)
            if refused is None or ctx.params.get("debug"):
                raise
            typer.echo(f"error: {system_error_line(refused)}", err=True)
            ctx.exit(SYSTEM_ERROR_STATUS)
        finally:
            release_output_locks()  # the command's output places (a process's end releases them too)


# One example per command, shown at the end of its help (tests/test_cli_help.py checks each names
# the command and only options it has).
EXAMPLES = {
    "demo": "balcaprl demo --out runs/demo",
    "synthetic build": "balcaprl synthetic build --out data/shapes --n-train 2000 --n-eval 200",
    "synthetic sft": "balcaprl synthetic sft --data data/shapes --out runs/sft",
    "synthetic caption": "balcaprl synthetic caption --policy runs/sft --data data/shapes --n 5",
    "synthetic show": 'balcaprl synthetic show --data data/shapes --index 3 --caption "A red circle."',
    "synthetic init-policy": "balcaprl synthetic init-policy --out runs/tiny",
    "synthetic probe": "balcaprl synthetic probe --policy runs/sft --data data/shapes",
    "data prepare sharegpt4v": "balcaprl data prepare sharegpt4v --json cap100k.json --image-root images "
    "--out data/sharegpt4v --tokenizer Qwen/Qwen2.5-VL-3B-Instruct",
    "data recaption": "balcaprl data recaption --data data/sharegpt4v --model gpt-5-mini --judge judge.yaml "
    "--limit 20",
    "data info": "balcaprl data info --data data/sharegpt4v",
    "judge serve": "balcaprl judge serve --oracle data/shapes --port 8765",
    "judge audit": "balcaprl judge audit --data data/shapes --captions captions.jsonl --judge judge.yaml "
    "--sample 200 --out runs/audit",
    "train": "balcaprl train configs/qwen2_5_vl_3b.yaml data.path=data/sharegpt4v run.output_dir=runs/q3b",
    "verl export": "balcaprl verl export --data data/sharegpt4v --tokenizer Qwen/Qwen2.5-VL-3B-Instruct",
    "verl launch": "balcaprl verl launch configs/qwen2_5_vl_3b.yaml --dry-run",
    "caption": "balcaprl caption --model runs/q3b/final --images data/shapes --out runs/q3b/captions.jsonl",
    "score": "balcaprl score --images data/shapes --captions captions.jsonl --references refs.json "
    "--judge judge.yaml --out runs/score",
    "evaluate": "balcaprl evaluate --captions runs/q3b/decap.jsonl --config eval.yaml --out runs/eval-q3b",
    "report": "balcaprl report runs/eval-base runs/eval-q3b --out runs/report",
    "evaluate-general": "balcaprl evaluate-general --model runs/q3b/final --out runs/eval-q3b --dry-run",
    "inspect": "balcaprl inspect runs/eval-q3b --out report.html",
    "figure advantage-collapse": "balcaprl figure advantage-collapse --out runs/fig2",
    "version": "balcaprl version",
}


def _example(path: str) -> str:
    """The example as shell lines of at most 54 characters (help screens fit 60 columns), continued
    with a backslash; ``\b`` keeps click from re-wrapping them."""
    lines = textwrap.wrap(EXAMPLES[path], 50, break_long_words=False, break_on_hyphens=False)
    return "\b\nExample:\n" + " \\\n".join(
        f"  {line}" if i == 0 else f"    {line}" for i, line in enumerate(lines)
    )


def _group(help: str) -> typer.Typer:
    return typer.Typer(help=help, no_args_is_help=True, add_completion=False)


class RootApp(typer.Typer):
    """The root app, built for the command a process runs: ``balcaprl score ...`` builds the click
    command of ``score`` alone (typer reads every command's signature and type hints when it builds
    one, some 50 ms for the whole tree, all before the first judge call); anything else (help, a
    mistyped name) builds the whole tree. Library and test callers (``get_command(app)``,
    ``CliRunner``) always see the whole tree."""

    def __call__(self, *args, **kwargs):
        argv = kwargs.get("args", args[0] if args else None)
        tokens = list(sys.argv[1:] if argv is None else argv)
        while tokens and tokens[0] == "--debug":  # the one root option that precedes a command
            tokens.pop(0)
        names = [info.name for info in (*self.registered_commands, *self.registered_groups)]
        if not tokens or tokens[0] not in names:
            return super().__call__(*args, **kwargs)
        one = copy.copy(self)
        one.registered_commands = [info for info in self.registered_commands if info.name == tokens[0]]
        one.registered_groups = [info for info in self.registered_groups if info.name == tokens[0]]
        return typer.Typer.__call__(one, *args, **kwargs)


app = RootApp(
    name="balcaprl",
    cls=RootGroup,
    help="Balanced RL for image captioners (c-GDPO) and multi-view caption evaluation (b-CapScore).",
    no_args_is_help=True,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_show_locals=False,  # locals may hold API keys
    rich_markup_mode=None,  # plain help: whole flag names at 80 columns, no value shown for switches
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(__version__)
        raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(
        False,
        "--version",
        callback=_print_version,
        is_eager=True,
        help="Print the installed version and exit.",
    ),
    debug: bool = typer.Option(
        False, "--debug", envvar=DEBUG_ENV, help="Show a user error's traceback too (or BALCAPRL_DEBUG=1)."
    ),
) -> None:
    """Balanced RL for image captioners (c-GDPO) and multi-view caption evaluation (b-CapScore)."""


@app.command("version", epilog=_example("version"))
def version() -> None:
    """Print the installed balcaprl version (as --version does)."""
    _print_version(True)


# Demo: the offline synthetic world, end to end and piece by piece.
app.command("demo", rich_help_panel="Demo", epilog=_example("demo"))(demo.demo)
synthetic_app = _group("The offline synthetic captioning world: scenes, oracle judge, tiny policy.")
synthetic_app.command("build", epilog=_example("synthetic build"))(synthetic.build)
synthetic_app.command("sft", epilog=_example("synthetic sft"))(synthetic.sft)
synthetic_app.command("caption", epilog=_example("synthetic caption"))(synthetic.caption)
synthetic_app.command("show", epilog=_example("synthetic show"))(synthetic.show)
synthetic_app.command("init-policy", epilog=_example("synthetic init-policy"))(synthetic.init_policy)
synthetic_app.command("probe", epilog=_example("synthetic probe"))(synthetic.probe)
app.add_typer(synthetic_app, name="synthetic", rich_help_panel="Demo")

# Data: dataset folders in the pinned format.
data_app = _group("Build, re-caption and inspect balcaprl dataset folders.")
prepare_app = _group("Turn a published dataset into a balcaprl dataset folder.")
prepare_app.command("sharegpt4v", epilog=_example("data prepare sharegpt4v"))(data.prepare_sharegpt4v)
data_app.add_typer(prepare_app, name="prepare")
data_app.command("recaption", epilog=_example("data recaption"))(data.recaption)
data_app.command("info", epilog=_example("data info"))(data.info)
app.add_typer(data_app, name="data", rich_help_panel="Data")

# Judge: the OpenAI-compatible judge endpoint.
judge_app = _group("Serve a local judge behind the OpenAI-compatible API, or audit judges.")
judge_app.command("serve", epilog=_example("judge serve"))(judge.serve)
judge_app.command("audit", epilog=_example("judge audit"))(judge.audit)
app.add_typer(judge_app, name="judge", rich_help_panel="Judge")

# Train: TRL on one node, verl on a cluster.
app.command("train", rich_help_panel="Train", epilog=_example("train"))(train.train)
verl_app = _group("Train on a Ray cluster with verl (needs the verl extra).")
verl_app.command("export", epilog=_example("verl export"))(verl.export)
verl_app.command("launch", epilog=_example("verl launch"))(verl.launch)
app.add_typer(verl_app, name="verl", rich_help_panel="Train")

# Evaluate: caption with a model, score the captions, compare runs.
app.command("caption", rich_help_panel="Evaluate", epilog=_example("caption"))(evaluate.caption)
app.command("score", rich_help_panel="Evaluate", epilog=_example("score"))(evaluate.score)
app.command("evaluate", rich_help_panel="Evaluate", epilog=_example("evaluate"))(evaluate.evaluate)
app.command("report", rich_help_panel="Evaluate", epilog=_example("report"))(evaluate.report)
app.command("evaluate-general", rich_help_panel="Evaluate", epilog=_example("evaluate-general"))(
    evaluate.evaluate_general
)
app.command("inspect", rich_help_panel="Evaluate", epilog=_example("inspect"))(inspect.inspect)

# Paper: the paper's figures.
figure_app = _group("Reproduce the paper's figures.")
figure_app.command("advantage-collapse", epilog=_example("figure advantage-collapse"))(
    figure.advantage_collapse
)
app.add_typer(figure_app, name="figure", rich_help_panel="Paper")
