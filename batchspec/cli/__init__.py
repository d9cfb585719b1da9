"""The `batchspec` command line: one thin module per command group, each parsing options,
loading config and calling the library. Every `BatchspecError` becomes one line and exit 1;
`--debug` (or BATCHSPEC_DEBUG=1) shows the traceback instead. SIGTERM (what a scheduler sends
first) unwinds the command like an error, so a run stops its workers and releases its OUTPUT,
and ends in one line with exit 143."""

from __future__ import annotations

import importlib
import importlib.util
import signal
import threading

import click

from batchspec.errors import BatchspecError, one_line

# command name -> module under batchspec.cli that defines a click command or group called `command`
COMMANDS = {
    "run": "run",
    "calibrate": "calibrate",
    "report": "report",
    "export": "export",
    "submit": "submit",
    "validate": "validate",
    "models": "models",
}


class LazyGroup(click.Group):
    """Imports a command's module only when that command runs, so `--help` stays fast."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(name for name, mod in COMMANDS.items() if _module_exists(mod))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        mod = COMMANDS.get(name)
        if mod is None or not _module_exists(mod):
            return None
        return importlib.import_module(f"batchspec.cli.{mod}").command

    def invoke(self, ctx: click.Context):
        previous = _on_sigterm(_terminate)
        try:
            return super().invoke(ctx)
        except BatchspecError as exc:
            if (ctx.obj or {}).get("debug"):
                raise
            raise click.ClickException(one_line(exc, limit=2000)) from exc
        except BaseException:
            if _TERMINATED.is_set():  # whatever the interrupt became on its way up (Ray wraps it in a SystemError)
                raise Stopped("stopped by SIGTERM; committed shards are kept: rerun to resume") from None
            raise
        finally:
            _on_sigterm(previous)


_TERMINATED = threading.Event()


class Terminated(KeyboardInterrupt):
    """Raised in the main thread by SIGTERM: an interrupt, which no `except Exception` swallows."""


class Stopped(click.ClickException):
    exit_code = 128 + signal.SIGTERM


def _terminate(signum, frame) -> None:
    _TERMINATED.set()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one stop at a time: the cleanup runs to its end
    raise Terminated

def _on_sigterm(handler):
    """Install `handler` for SIGTERM (main thread only; elsewhere nothing changes); the previous one."""
    if handler is None or threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, handler)


def _module_exists(mod: str) -> bool:
    return importlib.util.find_spec(f"batchspec.cli.{mod}") is not None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "BATCHSPEC"})
@click.option("--debug", is_flag=True, envvar="BATCHSPEC_DEBUG", help="Show tracebacks instead of one-line errors.")
@click.version_option(package_name="batchspec")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """batchspec: Parquet prompts in, Parquet completions out, with per-shard calibrated
    speculative decoding.

    \b
    Examples:
      batchspec run examples/prompts.parquet out
      batchspec calibrate examples/prompts.parquet --shard-by task
      batchspec report out --html report.html
      batchspec run requests.jsonl out && batchspec export out results.jsonl
      batchspec models list
    """
    ctx.obj = {"debug": debug}


def main() -> None:
    cli()

