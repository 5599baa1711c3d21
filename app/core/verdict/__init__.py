"""The verdict: one build (``build_verdict``), reached by every front end through one entry from
results to a verdict (``app.core.verdict.judge.judge``: the setting split, the cost records, the
joint verdict, the llama-server looked up once), and its renderers.

    from app.core.verdict import ExportOptions, build_verdict, markdown_report, verdict_dict, verdict_text
    from app.core.verdict.judge import cost_records_of, find_server, judge
"""

from app.core.verdict.export import Export, ExportOptions, export_command
from app.core.verdict.report import format_breakeven, markdown_report, verdict_dict, verdict_text, write_report
from app.core.verdict.verdict import (FITTED, MIX, PROBE, Command, ModelValidation, Verdict, build_verdict,
                                      check_cost_model, pays_sentence, probe_pays, probe_sentence)

__all__ = ["Export", "ExportOptions", "export_command", "format_breakeven", "markdown_report", "verdict_dict",
           "verdict_text", "write_report", "FITTED", "MIX", "PROBE", "Command", "ModelValidation", "Verdict", "build_verdict",
           "check_cost_model", "pays_sentence", "probe_pays", "probe_sentence"]
