"""qwen27b.controller.operations: JSON fixture cases run the way pyinfra tests its own operations.

One generated TestCase per operation; one test per tests/operations/<op>/<case>.json with the keys
`args`, `kwargs`, `facts` (keyed "<module>.<Fact>", then "arg=value" for facts with arguments),
`local_files` (controller files, faked), `commands` (a FileUploadCommand is ["upload", src, dest]),
`noop_description`, or `exception` ({name, message}) for refused arguments.
"""

from pathlib import Path

from pyinfra_testing.operations import make_operation_tests

OPERATION_CASES = Path(__file__).parent / "operations"
OPERATIONS = ("apt_hold", "directories", "push_files", "secret_file", "symlink_switch")

for _op in OPERATIONS:
    globals()[f"TestOperation_{_op}"] = make_operation_tests("qwen27b.controller", f"operations.{_op}", OPERATION_CASES / _op)

del _op
