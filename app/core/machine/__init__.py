"""Knowledge of the machine and models: hardware, GGUF reading, model inspection and fit, the Hugging Face hub."""
