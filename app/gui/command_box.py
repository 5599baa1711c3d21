"""The "Start from my llama-server command" box (Start page and Sweep tab): the user pastes the
command they run their server with; it is read as argv (never through a shell), its program
checked to be llama-server before that binary's --help is run, its flags checked against that
--help and the rule (app.core.engines.flag_rule), and it becomes the state's own command
(own_command.py): sweeps run llama-server with its kept flags and Export answers with it. A
problem is one line under the box. After Use, the box shows the command as it will be answered
with: its secrets as placeholders, never their values."""

from __future__ import annotations

from PySide6.QtWidgets import QGroupBox, QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QVBoxLayout, QWidget

from app.core.common.errors import UserError
from app.core.common.redact import redact
from app.core.common.text import printable
from app.core.engines.render import render

from .state import AppState

PLACEHOLDER = "llama-server -m model.gguf -ngl 99 -c 32768 -fa on -ctk q8_0 -ctv q8_0"
TOOLTIP = ("Paste the command you start your server with (bash, PowerShell or cmd; line continuations are fine). "
           "It is read as words, never through a shell; its program must be llama-server, and only that "
           "llama-server is run, once, for its --version and --help, to check the flags. Sweeps run llama-server "
           "with the flags known to change the measurement and nothing else (threads, memory, context, KV cache, "
           "offload, batching, devices, RPC, sampling defaults, the chat template), and the answer is your "
           "command with the speculative flags that pay. Host, port, -np, --metrics, logging and speculative "
           "flags are replaced while measuring; --api-key, --api-key-file and --hf-token are never recorded or "
           "shown. A flag that runs a program, opens a connection, downloads, writes files or sets a preset "
           "(MCP, tools, -hf, -mmu, --log-file, --log-prompts-dir, --*-default) is refused, naming it")


class ServerCommandBox(QGroupBox):
    """``folded``: the box is its title's check box until ticked or a command is in use (the Start
    page and the Sweep tab: unfolded, the box would make the window taller than 700 px)."""

    def __init__(self, state: AppState, parent: QWidget | None = None, folded: bool = False):
        super().__init__("Start from my llama-server command", parent)
        self.state = state
        self.folded = folded
        self.edit = QPlainTextEdit()
        self.edit.setPlaceholderText(PLACEHOLDER)
        self.edit.setToolTip(TOOLTIP)
        self.edit.setFixedHeight(self.edit.fontMetrics().lineSpacing() * 4 + 12)
        self.use_btn = QPushButton("Use this command")
        self.use_btn.clicked.connect(self.use)
        self.clear_btn = QPushButton("Clear")
        self.clear_btn.clicked.connect(self.clear)
        self.status = QLabel("")
        self.status.setWordWrap(True)
        buttons = QHBoxLayout()
        buttons.addWidget(self.use_btn)
        buttons.addWidget(self.clear_btn)
        buttons.addStretch(1)
        self.body = QWidget()
        lay = QVBoxLayout(self.body)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.edit)
        lay.addLayout(buttons)
        lay.addWidget(self.status)
        self.outer = QVBoxLayout(self)
        self.outer.addWidget(self.body)
        if folded:  # folded: the title's check box alone, no empty frame under it
            self.setCheckable(True)
            self.setChecked(False)
            self.toggled.connect(self._ticked)
            self._fold(False)
        state.own_command.changed.connect(self.show_command)
        self.show_command()

    def _ticked(self, on: bool) -> None:
        """Unticked: the command is off (the next sweep runs the tuner's own flags, Export answers
        without it); the text stays in the box, for Use after ticking it again."""
        self._fold(on)
        if not on and self.state.own_command.command is not None:
            self.state.own_command.set(None, unticked=True)

    def _fold(self, open_: bool) -> None:
        self.body.setVisible(open_)
        self.setFlat(not open_)
        m = 9 if open_ else 0
        self.outer.setContentsMargins(m, m, m, m)

    def use(self) -> None:
        """Read and check the pasted command; the state takes it, or the problem is shown."""
        from app.core.engines.server.binary import load_user_command  # runs --help once per binary

        text = self.edit.toPlainText().strip()
        if not text:
            self.state.own_command.set(None)
            return
        try:
            command, binary = load_user_command(text, self.state.server_bin)
        except UserError as e:
            self.status.setStyleSheet("color: #b00020;")
            self.status.setText(printable(redact(str(e).splitlines()[0]) if str(e) else "the command cannot be used"))
            return
        self.state.own_command.set(command, binary)

    def clear(self) -> None:
        self.edit.clear()
        self.state.own_command.set(None)

    def show_command(self) -> None:
        """The state's command: the box shows it without secrets, the line says what measuring does."""
        command = self.state.own_command.command
        self.clear_btn.setEnabled(command is not None)
        if self.folded and (command is not None or self.state.own_command.unticked):
            self.setChecked(command is not None)  # every box says whether a command is in use
        self.status.setStyleSheet("")
        if command is None:
            self.status.setText("Optional: sweeps then measure your own server's flags, and the answer is your "
                                "command with the flags that pay.")
            return
        try:
            shown = render(list(command.base_argv()), command.shell)
        except UserError:  # an argument that shell cannot carry (a line break for cmd): as bash writes it
            shown = render(list(command.base_argv()), "bash")
        self.edit.setPlainText(shown)
        self.status.setText(printable(redact(command.note())))
