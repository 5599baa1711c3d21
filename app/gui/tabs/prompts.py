"""Prompts tab: the built-in suites by task type and the user's own prompts (add, edit, delete,
import and export JSON), saved to the per-user prompts file the sweeps read."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (QComboBox, QFileDialog, QFormLayout, QHBoxLayout, QLineEdit, QPlainTextEdit,
                               QPushButton, QSplitter, QVBoxLayout, QWidget)

from app.core.common.errors import UserError
from app.core.common.paths import user_prompts_path
from app.core.measure.prompts import builtin_prompts, load_prompt_file, save_prompt_file
from app.core.records.prompt import Prompt

from ..common import fill, table
from ..state import AppState


class PromptsTab(QWidget):
    def __init__(self, state: AppState, parent: QWidget | None = None):
        super().__init__(parent)
        self.state = state
        lay = QVBoxLayout(self)
        split = QSplitter(Qt.Orientation.Horizontal)
        self.prompt_table = table(["id", "task", "lang", "source", "text"],
                                  {3: "built-in prompts ship with the app; yours are saved in your prompts "
                                      "file and replace a built-in one of the same id"})
        self.prompt_table.itemSelectionChanged.connect(self._prompt_selected)
        split.addWidget(self.prompt_table)
        ed = QWidget()
        form = QFormLayout(ed)
        self.prompt_id = QLineEdit()
        self.prompt_id.setToolTip("A short unique name; results are grouped by it")
        self.prompt_task = QComboBox(editable=True)
        self.prompt_task.addItems(["story", "code", "tongue-twister"])
        self.prompt_task.setToolTip("Task type: acceptance, and so MTP's pay-off, depends on it. Type a new "
                                    "name for a task type of your own")
        self.prompt_lang = QLineEdit()
        self.prompt_lang.setPlaceholderText("en")
        self.prompt_text = QPlainTextEdit()
        form.addRow("id", self.prompt_id)
        form.addRow("task", self.prompt_task)
        form.addRow("language", self.prompt_lang)
        form.addRow("text", self.prompt_text)
        buttons = QHBoxLayout()
        for label, slot, tip in (("New", self.new_prompt, "Clear the editor for a new prompt"),
                                 ("Save", self.save_prompt, "Save as one of your prompts (a built-in id makes "
                                                           "your version replace the built-in one)"),
                                 ("Delete", self.delete_prompt, "Delete one of your prompts"),
                                 ("Import…", self.import_prompts, "Add prompts from a JSON list or JSONL file "
                                                                 "of {id, task, text, lang}"),
                                 ("Export…", self.export_prompts, "Save your prompts as a JSON file")):
            b = QPushButton(label)
            b.setToolTip(tip)
            b.clicked.connect(slot)
            buttons.addWidget(b)
        form.addRow(buttons)
        split.addWidget(ed)
        split.setSizes([650, 450])
        lay.addWidget(split)
        self._prompt_rows: list[tuple[Prompt, str]] = []  # (prompt, its source)
        state.prompts_changed.connect(self.show_prompts)
        self.refresh_prompts()

    @property
    def user_prompt_list(self) -> list[Prompt]:
        return self.state.user_prompts

    def refresh_prompts(self) -> None:
        self.state.reload_prompts()  # prompts_changed shows them

    def show_prompts(self) -> None:
        mine = {q.id for q in self.user_prompt_list}
        self._prompt_rows = [(q, "built-in") for q in builtin_prompts() if q.id not in mine] + \
                            [(q, "yours") for q in self.user_prompt_list]
        fill(self.prompt_table, [(q.id, q.task, q.lang, src, q.text.replace("\n", " ")[:120])
                                 for q, src in self._prompt_rows])

    def _prompt_selected(self) -> None:
        rows = self.prompt_table.selectionModel().selectedRows()
        if not rows:
            return
        q, _ = self._prompt_rows[rows[0].row()]
        self.prompt_id.setText(q.id)
        self.prompt_task.setCurrentText(q.task)
        self.prompt_lang.setText(q.lang)
        self.prompt_text.setPlainText(q.text)

    def new_prompt(self) -> None:
        self.prompt_table.clearSelection()
        for wdg in (self.prompt_id, self.prompt_lang, self.prompt_text):
            wdg.clear()

    def _save_user(self, prompts: list[Prompt]) -> bool:
        try:
            save_prompt_file(user_prompts_path(), prompts)
        except (UserError, OSError) as e:
            self.state.show_error(f"{user_prompts_path()}: cannot save your prompts ({e})")
            return False
        self.refresh_prompts()
        return True

    def save_prompt(self) -> None:
        q = Prompt(self.prompt_id.text().strip(), self.prompt_task.currentText().strip(),
                   self.prompt_text.toPlainText(), self.prompt_lang.text().strip())
        missing = [n for n, v in (("id", q.id), ("task", q.task), ("text", q.text.strip())) if not v]
        if missing:
            self.state.show_error(f"the prompt needs {', '.join(missing)}")
            return
        others = [p for p in self.user_prompt_list if p.id != q.id]
        self._save_user(others + [q])

    def delete_prompt(self) -> None:
        qid = self.prompt_id.text().strip()
        if qid not in {p.id for p in self.user_prompt_list}:
            self.state.show_error(f"{qid or 'this prompt'}: only your own prompts can be deleted")
            return
        if self._save_user([p for p in self.user_prompt_list if p.id != qid]):
            self.new_prompt()

    def import_prompts(self, path: str | None = None) -> None:
        if not path:
            path, _ = QFileDialog.getOpenFileName(self, "Import prompts", "", "Prompts (*.json *.jsonl)")
            if not path:
                return
        try:
            new = load_prompt_file(path)
        except UserError as e:
            self.state.show_error(str(e))
            return
        ids = {q.id for q in new}
        self._save_user([p for p in self.user_prompt_list if p.id not in ids] + new)

    def export_prompts(self, path: str | None = None) -> None:
        if not path:
            path, _ = QFileDialog.getSaveFileName(self, "Export your prompts", "prompts.json", "JSON (*.json)")
            if not path:
                return
        prompts = self.user_prompt_list or [q for q, _ in self._prompt_rows]
        try:
            save_prompt_file(path, prompts)
        except (UserError, OSError) as e:
            self.state.show_error(f"{path}: cannot export ({e})")
            return
        self.state.status.emit(f"{len(prompts)} prompts written to {path}")
