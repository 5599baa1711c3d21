"""A prompt as runs record it: id, task type, text, language (the suites and files that hold them
are in app.core.measure.prompts)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Prompt:
    id: str
    task: str
    text: str
    lang: str = ""
