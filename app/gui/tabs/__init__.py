"""One QWidget per tab (the Sweep and Results tabs are folders of their parts); each is built with the
AppState and the services it uses, and talks to the others only through the state."""
