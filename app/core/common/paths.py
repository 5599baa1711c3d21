"""Per-user folders (platformdirs); MTP_TUNER_HOME overrides them all (tests, portable use)."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP = "mtp-tuner"


def _base(kind: str) -> Path:
    home = os.environ.get("MTP_TUNER_HOME")
    if home:
        return Path(home) / kind
    fn = {"data": platformdirs.user_data_dir, "cache": platformdirs.user_cache_dir,
          "log": platformdirs.user_log_dir}[kind]
    return Path(fn(APP, appauthor=False))


def data_dir() -> Path:
    return _base("data")


def cache_dir() -> Path:
    return _base("cache")


def log_dir() -> Path:
    return _base("log")


def results_dir() -> Path:
    return data_dir() / "results"


def models_dir() -> Path:
    return data_dir() / "models"


def user_prompts_path() -> Path:
    """The user's own prompts (JSON list of {id, task, text, lang}), edited in the Prompts tab."""
    return data_dir() / "prompts.json"


def same_path(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether ``a`` and ``b`` name the same file or folder (links resolved); as written when unresolvable."""
    try:
        return os.path.realpath(a) == os.path.realpath(b)
    except (OSError, ValueError):
        return os.fspath(a) == os.fspath(b)
