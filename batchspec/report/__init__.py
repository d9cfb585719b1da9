"""`batchspec report`: what a run did, read back from OUTPUT alone: `load` (the numbers), `html`
(the page), `plots` (its figures)."""

from batchspec.report.html import event_rows, render_html, table_rows  # noqa: F401
from batchspec.report.load import RunReport, load_report, storage_options  # noqa: F401
