"""Shared plumbing every layer may use: errors, atomic writes, paths, cancel, locks, resources, logs."""
