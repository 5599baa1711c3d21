"""One QWidget per tab; each is built with the AppState only and talks to the others through it."""
