"""Shipped onto hosts as one package (`<release venv>/lib/qwen27b_onhost/`): stdlib plus the
stack's host_packages only, and relative imports only, since it runs there under another name."""
