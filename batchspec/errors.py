"""The project's user-facing errors.

Three tiers (docs/architecture.md, "Errors"): `assert` for our own invariants; these
`BatchspecError` subclasses for bad configuration or input, each with a one-line message naming
what was wrong; `click.ClickException` only in the CLI, which turns any `BatchspecError` into one
line and a non-zero exit.
"""


from batchspec.redact import redact_text


class BatchspecError(Exception):
    """A problem the user can fix; the message is one line and names the culprit."""


class ConfigError(BatchspecError):
    """A pipeline, trt_config or job file (or an option) is invalid: names file, key, expectation."""


class InputError(BatchspecError):
    """The input data cannot be read or lacks what the pipeline needs."""


class ModelError(BatchspecError):
    """A model cannot be found, prepared, loaded or paired with its draft."""


class EngineUnavailable(BatchspecError):
    """The chosen engine cannot run here (for example `tensorrt_llm` is not importable)."""


class OutputError(BatchspecError):
    """The output location cannot be written, or holds a different run."""


ONE_LINE_LIMIT = 300


def one_line(exc: BaseException | str, limit: int = ONE_LINE_LIMIT) -> str:
    """An exception (or text) as one line of at most `limit` characters: the only formatter of
    library errors inside batchspec's own messages, and of every error line the CLI prints. URLs in
    it lose their user info and signed query values (batchspec.redact)."""
    text = redact_text(" ".join(str(exc).split()))
    if not text:
        return type(exc).__name__ if isinstance(exc, BaseException) else ""
    return text[:limit]
