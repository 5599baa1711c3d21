"""The schema: run and cost records, prompts as recorded, results files (JSONL) read and written."""
