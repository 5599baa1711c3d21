"""Calibrated models: GGUFs whose draft acceptance is known by construction, with simulators of
llama.cpp's draft/verify loop over their tables. The project's test double: real models that real
engines run, never an engine of their own. ``design`` (the qwen35 MTP model and its tables),
``gguf`` (its writer), ``demo`` (the demo model and its settings), ``modes`` (a draft model for
draft-simple and n-gram prompts), ``gemma4`` (a Gemma 4 target and assistant pair)."""
