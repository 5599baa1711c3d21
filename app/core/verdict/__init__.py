"""The verdict: one build (``build_verdict``) for every front end, and its renderers.

    from app.core.verdict import ExportOptions, build_verdict, markdown_report, verdict_dict, verdict_text
"""

from app.core.verdict.export import Export, ExportOptions, export_command
from app.core.verdict.report import format_breakeven, markdown_report, verdict_dict, verdict_text, write_report
from app.core.verdict.verdict import (FITTED, MIX, PROBE, Command, ModelValidation, Verdict, build_verdict,
                                      check_cost_model, pays_sentence, probe_pays, probe_sentence)

__all__ = ["Export", "ExportOptions", "export_command", "format_breakeven", "markdown_report", "verdict_dict",
           "verdict_text", "write_report", "FITTED", "MIX", "PROBE", "Command", "ModelValidation", "Verdict", "build_verdict",
           "check_cost_model", "pays_sentence", "probe_pays", "probe_sentence"]
