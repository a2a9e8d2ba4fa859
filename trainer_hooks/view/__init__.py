"""Looking at a bundle: ``rollout-bundle view BUNDLE -o report.html``.

:func:`write_html_report` writes one self-contained HTML page for a debug dump or checkpoint
(directory or packed file): kind, meta, counts, sizes and dedup ratio, then each sample with its
status, reward, lengths and screenshots, and, given a replay report, the guard and token-check
results. See :mod:`trainer_hooks.view._report`.
"""

from trainer_hooks.view._report import ReportError, ReportWritten, load_replay_report, write_html_report

__all__ = ["ReportError", "ReportWritten", "load_replay_report", "write_html_report"]
