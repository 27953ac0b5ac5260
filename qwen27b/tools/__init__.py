"""Operator commands run on the controller: bench, doctor, status (`qwen27b ...`), the CPU smoke build."""
