"""The sampler a run decodes with: the llama.cpp sampling settings a user chooses (temperature,
top-k, top-p, min-p, repeat penalty, seed), its presets (greedy, the model's recommended
settings, custom), and the record's ``sampling`` dict.

Both engines build llama.cpp's own chain from it, in llama-server's default order
(common/common.h ``common_params_sampling::samplers``, built by common_sampler_init in
common/sampling.cpp): an optional logit bias, then penalties, dry, top_n_sigma, top_k, typ_p,
top_p, min_p, xtc, temperature, and dist (the seeded draw). What a user does not choose keeps
llama.cpp's default, which leaves that step a no-op (:data:`FIXED`).
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Mapping

from app.core.common.errors import UserError
from app.core.common import jsonsafe
from app.core.common.resources import resource

# llama-server's default chain (common_sampler_type_to_str names; the request's "samplers")
CHAIN = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")
# the settings nobody here changes, at llama.cpp's defaults (common/common.h): sent to the server
# with every request so that its command-line or GGUF defaults cannot change them
FIXED: dict[str, Any] = {
    "repeat_last_n": 64, "presence_penalty": 0.0, "frequency_penalty": 0.0,
    "dry_multiplier": 0.0, "dry_base": 1.75, "dry_allowed_length": 2, "dry_penalty_last_n": 64,
    "top_n_sigma": -1.0, "typical_p": 1.0, "xtc_probability": 0.0, "xtc_threshold": 0.1,
    "dynatemp_range": 0.0, "dynatemp_exponent": 1.0, "mirostat": 0, "min_keep": 0, "n_probs": 0,
}
DRY_BREAKERS = ("\n", ":", "\"", "*")  # common_params_sampling::dry_sequence_breakers
MAX_SEED = 2**32 - 2  # 0xFFFFFFFF is LLAMA_DEFAULT_SEED: "a random seed"
GREEDY, RECOMMENDED, CUSTOM = "greedy", "recommended", "custom"
PRESETS = (GREEDY, RECOMMENDED, CUSTOM)
# GGUF keys llama.cpp itself reads as a model's sampling defaults (common_params_sampling_from_model)
GGUF_KEYS = {"temperature": "general.sampling.temp", "top_k": "general.sampling.top_k",
             "top_p": "general.sampling.top_p", "min_p": "general.sampling.min_p",
             "repeat_penalty": "general.sampling.penalty_repeat"}
VALUES = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "seed")


@dataclasses.dataclass(frozen=True)
class Sampler:
    """One sampler setting; the defaults are llama.cpp's (temperature 0: greedy). ``preset`` and
    ``source`` say where the values came from and take no part in equality: two settings with
    the same values are the same setting."""

    temperature: float = 0.0
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    seed: int = 42
    preset: str = dataclasses.field(default=CUSTOM, compare=False)
    source: str = dataclasses.field(default="", compare=False)

    def __post_init__(self) -> None:
        for name in ("temperature", "top_p", "min_p", "repeat_penalty"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise UserError(f"{name.replace('_', '-')} must be a finite number, got {v!r}")
            object.__setattr__(self, name, float(v))
        if self.temperature < 0:
            raise UserError(f"temperature must not be negative, got {self.temperature:g}")
        if not 0.0 <= self.top_p <= 1.0:
            raise UserError(f"top-p must be between 0 and 1, got {self.top_p:g}")
        if not 0.0 <= self.min_p <= 1.0:
            raise UserError(f"min-p must be between 0 and 1, got {self.min_p:g}")
        if self.repeat_penalty <= 0:
            raise UserError(f"repeat penalty must be above 0 (1 = off), got {self.repeat_penalty:g}")
        for name, hi in (("top_k", 2**31 - 1), ("seed", MAX_SEED)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= hi:
                raise UserError(f"{name.replace('_', '-')} must be a whole number from 0 to {hi}, got {v!r}")
        if self.preset not in PRESETS:
            raise UserError(f"unknown sampler preset {self.preset!r}: use {', '.join(PRESETS)}")

    @property
    def greedy(self) -> bool:
        """Temperature 0: llama.cpp keeps only the best token, so the output is deterministic and
        speculative decoding must reproduce the baseline token for token."""
        return self.temperature <= 0

    @property
    def label(self) -> str:
        """'greedy', or 'temperature 0.7, top-k 20, top-p 0.8, min-p 0, seed 42' (the repeat
        penalty only when it is on)."""
        if self.greedy and self.repeat_penalty == 1.0:
            return GREEDY
        parts = [f"temperature {self.temperature:g}"]
        if not self.greedy:
            parts += [f"top-k {self.top_k}", f"top-p {self.top_p:g}", f"min-p {self.min_p:g}"]
        if self.repeat_penalty != 1.0:
            parts.append(f"repeat penalty {self.repeat_penalty:g}")
        if not self.greedy:
            parts.append(f"seed {self.seed}")
        return ", ".join(parts)

    def with_temperature(self, t: float) -> "Sampler":
        """This setting at another temperature (0: the greedy preset)."""
        keep = CUSTOM if self.preset == GREEDY else self.preset
        return dataclasses.replace(self, temperature=t, preset=GREEDY if t <= 0 else keep)

    def request(self) -> dict[str, Any]:
        """The llama-server request fields (/completion) that fix the whole chain."""
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p,
                "min_p": self.min_p, "repeat_penalty": self.repeat_penalty, "seed": self.seed,
                "samplers": list(CHAIN), **FIXED}

    def to_dict(self) -> dict[str, Any]:
        """The record's ``sampling`` values (the runner adds raw and ignore_eos)."""
        d: dict[str, Any] = {name: getattr(self, name) for name in VALUES}
        d.update(repeat_last_n=FIXED["repeat_last_n"], chain=list(CHAIN), preset=self.preset)
        if self.source:
            d["source"] = self.source
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> "Sampler":
        """A record's ``sampling``. Older files have only temperature and seed: the rest were
        llama.cpp's defaults, which are this class's."""
        d = d or {}
        kw = {name: d[name] for name in VALUES if d.get(name) is not None}
        if "top_k" in kw:
            kw["top_k"] = int(kw["top_k"])
        if "seed" in kw:
            kw["seed"] = int(kw["seed"])
        preset = d.get("preset")
        if preset not in PRESETS:
            preset = GREEDY if float(kw.get("temperature", 0.0)) <= 0 else CUSTOM
        return cls(**kw, preset=preset, source=str(d.get("source") or ""))


def greedy(seed: int = 42) -> Sampler:
    return Sampler(temperature=0.0, seed=seed, preset=GREEDY)


# what pairs runs: the sampler's values in VALUES' order (from a record's sampling: JSON's values)
SettingKey = tuple[object, ...]


def setting_key(sampling: Mapping[str, Any] | None) -> SettingKey:
    """What pairs runs: the same values (seed included) are the same setting; a record without a
    value had llama.cpp's default."""
    s = sampling or {}
    return tuple(_DEFAULTS[k] if s.get(k) is None else s[k] for k in VALUES)


_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Sampler)}


# -- the model's recommended settings ------------------------------------------------------

def _table() -> dict[str, Any]:
    with open(resource("samplers.json"), encoding="utf-8") as f:
        table: dict[str, Any] = jsonsafe.loads(f.read())
    return table


def recommended_from_metadata(metadata: Mapping[str, Any], seed: int = 42) -> Sampler:
    """The recommended settings for a model from its GGUF metadata: the ``general.sampling.*``
    keys llama.cpp reads itself when the file has them, else the family table
    (resources/samplers.json, by ``general.architecture``, each entry with its source). A value
    neither gives keeps llama.cpp's default. A model with neither: a UserError."""
    kw: dict[str, Any] = {}
    for name, key in GGUF_KEYS.items():
        v = metadata.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            kw[name] = int(v) if name == "top_k" else float(v)
    if kw:
        return Sampler(**kw, seed=seed, preset=RECOMMENDED, source="the model file (GGUF general.sampling.*)")
    arch = str(metadata.get("general.architecture", ""))
    entry = _table().get("families", {}).get(arch)
    if not entry:
        raise UserError(f"no recommended sampling is known for {arch or 'this model'} (the file has no "
                        "general.sampling.* keys and resources/samplers.json no entry); choose custom settings")
    vals = {name: entry[name] for name in ("temperature", "top_k", "top_p", "min_p", "repeat_penalty") if name in entry}
    return Sampler(**vals, seed=seed, preset=RECOMMENDED, source=f"{entry['name']}: {entry['source']}")


def recommended(model: str | os.PathLike[str], seed: int = 42) -> Sampler:
    """:func:`recommended_from_metadata` of a GGUF file."""
    from app.core.machine.gguf_info import read_header  # deferred: only the recommended preset reads a header

    return recommended_from_metadata(read_header(model, keep_arrays=False).metadata, seed)


def preset(name: str, model: str | os.PathLike[str] | None = None, *, seed: int = 42, **custom: Any) -> Sampler:
    """A sampler by preset: greedy, recommended (for ``model``) or custom (``custom``'s values,
    llama.cpp's defaults for the rest)."""
    if name == GREEDY:
        return greedy(seed)
    if name == RECOMMENDED:
        if model is None:
            raise UserError("the recommended sampler needs the model")
        return recommended(model, seed)
    if name == CUSTOM:
        return Sampler(**{k: v for k, v in custom.items() if v is not None}, seed=seed, preset=CUSTOM)
    raise UserError(f"unknown sampler preset {name!r}: use {', '.join(PRESETS)}")
