"""One verdict from one analysis, and its renderers (text, CSV, JSON, Markdown, the exported command)."""
