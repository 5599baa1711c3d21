"""What runs llama.cpp: the Engine protocol and settings, make_engine, in-process and llama-server engines (the calibrated models are app.core.calibrated)."""
