"""qwen27b: the pure logic behind the deploy (stack, facts, gate, planner, templates).

Everything here is importable and testable without pyinfra running a deploy.
"""
