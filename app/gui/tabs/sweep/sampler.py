"""The Sweep tab's sampler settings: greedy, the model's recommended
settings (its GGUF general.sampling.* keys, else the per-family table, with its source) or custom
values (temperature, top-k, top-p, min-p, repeat penalty, seed), temperature as an axis, and at
temperature > 0 probabilistic draft sampling beside greedy. Both engines sample with llama.cpp's own
chain at these settings."""

from __future__ import annotations

from PySide6.QtWidgets import (QCheckBox, QComboBox, QDoubleSpinBox, QGridLayout, QHBoxLayout, QLabel, QLineEdit,
                               QSpinBox, QWidget)

from app.core.common.errors import UserError
from app.core.measure.plan import parse_float_list
from app.core.records import sampler as S
from app.core.records.arm import GREEDY_DRAFT, PROBABILISTIC

from ...state import AppState

PRESETS = {"greedy": S.GREEDY, "model's recommended": S.RECOMMENDED, "custom": S.CUSTOM}
TIPS = {
    "preset": "How the target picks each token. Greedy (temperature 0): always the best token, so a "
              "speculative run must give the baseline's tokens exactly, and that is checked. The model's "
              "recommended settings: from the model file (general.sampling.*) when it has them, else a "
              "table per model family with its source. Custom: your values. llama.cpp keeps a draft only "
              "while the target's own sample equals it, so acceptance and speedup depend on this",
    "axis": "Temperature as a sweep axis, e.g. 0,0.7: every arm is measured at each temperature (the other "
            "values kept), each sampled run beside a baseline of the same sampler and seed; one verdict per "
            "temperature. Empty: the setting above only",
    "probabilistic": "Measure each draft width also with llama-server's --spec-draft-sampling probabilistic: the "
                     "draft is sampled and the target verifies it by rejection sampling (lossless), as its own "
                     "arms beside greedy. Runs on llama-server (b11368 and later list the flag)",
    "probabilistic_off": "Only at temperature > 0 (every temperature of the axis): at temperature 0 the target "
                         "takes its best token, so drafts are verified greedily either way",
}


def _spin(lo: float, hi: float, step: float, value: float, decimals: int, prefix: str) -> QDoubleSpinBox:
    w = QDoubleSpinBox(minimum=lo, maximum=hi, singleStep=step, value=value)
    w.setDecimals(decimals)
    w.setPrefix(prefix)
    return w


def _int_spin(hi: int, value: int, prefix: str) -> QSpinBox:
    """A whole-number field from 0 to hi, in steps of 1."""
    w = QSpinBox(minimum=0, maximum=hi, singleStep=1, value=value)
    w.setPrefix(prefix)
    return w


class SamplerBox:
    """The fields; the tab puts :meth:`rows` in its form and builds its plan's samplers with
    :meth:`samplers`."""

    def __init__(self, state: AppState, parent: QWidget | None = None) -> None:
        self.state = state
        self.preset_box = QComboBox(parent)
        self.preset_box.addItems(list(PRESETS))
        self.preset_box.setToolTip(TIPS["preset"])
        self.source = QLabel("", parent)
        self.source.setWordWrap(True)
        self.temp = _spin(0.0, 5.0, 0.05, 0.7, 2, "temp ")
        self.top_k = _int_spin(100000, 40, "top-k ")
        self.top_p = _spin(0.0, 1.0, 0.05, 0.95, 3, "top-p ")
        self.min_p = _spin(0.0, 1.0, 0.01, 0.05, 3, "min-p ")
        self.repeat = _spin(0.01, 5.0, 0.05, 1.0, 2, "repeat ")
        self.seed = _int_spin(2**31 - 1, 42, "seed ")
        for w, tip in ((self.temp, "temperature (0 = greedy)"), (self.top_k, "top-k (0 = off)"),
                       (self.top_p, "top-p (1 = off)"), (self.min_p, "min-p (0 = off)"),
                       (self.repeat, "repeat penalty over the last 64 tokens (1 = off)"),
                       (self.seed, "the sampler's seed: each sampled run and its baseline use it")):
            w.setToolTip(tip)
        self.values = QWidget(parent)
        grid = QGridLayout(self.values)  # three a row: narrow enough for the Advanced groups
        grid.setContentsMargins(0, 0, 0, 0)
        for i, field in enumerate(self.value_widgets()):
            grid.addWidget(field, i // 3, i % 3)
        self.head = QWidget(parent)
        head = QHBoxLayout(self.head)
        head.setContentsMargins(0, 0, 0, 0)
        head.addWidget(self.preset_box)
        head.addWidget(self.source, 1)
        self.axis = QLineEdit(parent)
        self.axis.setPlaceholderText("e.g. 0,0.7 (empty: the setting above)")
        self.axis.setToolTip(TIPS["axis"])
        self.probabilistic = QCheckBox("also probabilistic draft sampling", parent)
        self.preset_box.currentTextChanged.connect(lambda *_: self.refresh())
        self.temp.valueChanged.connect(lambda *_: self.refresh_draft_sampling())
        self.axis.textChanged.connect(lambda *_: self.refresh_draft_sampling())
        state.model_changed.connect(lambda *_: self.refresh())
        self.refresh()

    def value_widgets(self) -> list[QWidget]:
        return [self.temp, self.top_k, self.top_p, self.min_p, self.repeat, self.seed]

    def rows(self) -> list[tuple[str, QWidget]]:
        """(label, field) for the tab's form."""
        return [("Sampler", self.head), ("Sampler values", self.values), ("Temperatures", self.axis),
                ("Draft sampling", self.probabilistic)]

    def refresh_draft_sampling(self) -> None:
        """Probabilistic draft sampling is offered only when every setting samples (temperature > 0)."""
        try:
            ok = all(s.temperature > 0 for s in self.samplers(self.state.model))
        except UserError:
            ok = False
        self.probabilistic.setEnabled(ok)
        self.probabilistic.setToolTip(TIPS["probabilistic" if ok else "probabilistic_off"])

    def draft_samplings(self) -> tuple[str, ...]:
        """The draft samplings the plan's drafting arms are measured with."""
        on = self.probabilistic.isEnabled() and self.probabilistic.isChecked()
        return (GREEDY_DRAFT, PROBABILISTIC) if on else (GREEDY_DRAFT,)

    def preset(self) -> str:
        return PRESETS[self.preset_box.currentText()]

    def refresh(self) -> None:
        """The values of the preset in the fields (editable for custom only), and where they came from."""
        name = self.preset()
        for w in self.value_widgets()[:-1]:
            w.setEnabled(name == S.CUSTOM)
        self.refresh_draft_sampling()
        if name == S.CUSTOM:
            self.source.setText("your values")
            self.source.setToolTip("")
            return
        try:
            s = self.base(self.state.model)
        except UserError as e:
            self.source.setText(str(e))
            return
        self.put(s)
        self.source.setText("temperature 0: output checked against the baseline" if name == S.GREEDY
                            else "from " + s.source.split(": ", 1)[0])
        self.source.setToolTip(s.source)  # the table entry's source in full

    def put(self, s: S.Sampler) -> None:
        self.temp.setValue(s.temperature)
        self.top_k.setValue(s.top_k)
        self.top_p.setValue(s.top_p)
        self.min_p.setValue(s.min_p)
        self.repeat.setValue(s.repeat_penalty)
        self.seed.setValue(min(s.seed, self.seed.maximum()))

    def base(self, model: str | None) -> S.Sampler:
        """The setting of the preset and fields (a UserError when the model has no recommended settings)."""
        name, seed = self.preset(), self.seed.value()
        if name == S.CUSTOM:
            return S.Sampler(self.temp.value(), self.top_k.value(), self.top_p.value(), self.min_p.value(),
                             self.repeat.value(), seed, preset=S.CUSTOM)
        if name == S.RECOMMENDED and not model:
            raise UserError("choose a model for its recommended settings")
        return S.preset(name, model, seed=seed)

    def samplers(self, model: str | None) -> tuple[S.Sampler, ...]:
        """The plan's settings: the one above, or one per temperature of the axis."""
        base = self.base(model)
        text = self.axis.text().strip()
        if not text:
            return (base,)
        try:
            temps = parse_float_list(text, "Temperatures")
        except UserError as e:
            raise UserError(str(e)) from None
        if any(t < 0 for t in temps):
            raise UserError("Temperatures: a temperature must not be negative")
        return tuple(dict.fromkeys(base.with_temperature(t) for t in temps))

    def show(self, samplers: tuple[S.Sampler, ...], probabilistic: bool = False) -> None:
        """A plan's settings in the fields (Run again): its first sampled setting, the axis, and
        whether it measured probabilistic draft sampling."""
        s = next((x for x in samplers if not x.greedy), samplers[0])
        label = next(k for k, v in PRESETS.items() if v == (S.CUSTOM if s.preset == S.RECOMMENDED else s.preset))
        self.preset_box.setCurrentText(label if len(samplers) == 1 else "custom")
        self.put(s)
        self.axis.setText(",".join(f"{x.temperature:g}" for x in samplers) if len(samplers) > 1 else "")
        self.probabilistic.setChecked(probabilistic)
        self.refresh_draft_sampling()
