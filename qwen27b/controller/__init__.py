"""Controller code bound to pyinfra: facts, operations, rendering, the run summary and reports."""
