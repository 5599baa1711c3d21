"""Qt drawing without a window: the result card's and the community placement's pictures
(card_png), for the CLI's ``card --png`` and the window's Results tab alike. It uses the core and
Qt, never the CLI or the GUI (pyproject.toml's import contracts)."""
