"""A model the in-process engine has loaded: its llama.cpp handles and what was read of it once
(vocabulary, widths, MTP heads, chat template). The engine (engines.inprocess) makes it and its
decode loop (engines.decode_loop) reads it."""

from __future__ import annotations

import dataclasses

from app.core.engines.chat_template import ModelTemplate
from app.core.machine.gguf_info import GGUFHeader


@dataclasses.dataclass
class LoadedModel:
    path: str
    header: GGUFHeader
    model: object
    vocab: object
    n_vocab: int
    n_embd: int
    has_mtp: bool
    template: str | None
    bos: str
    eos: str
    eog: tuple[int, ...] | None = None  # the end-of-generation tokens, found on first use
    chat: ModelTemplate | None = None  # the template as rendered here (thinking switch, reasoning markers)
