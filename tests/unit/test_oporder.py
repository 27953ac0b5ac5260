"""qwen27b/controller/oporder.py: the deploy file, as a module inspect finds by its file name, so
pyinfra's call-stack walk per operation does not scan sys.modules for it every time."""

from __future__ import annotations

import inspect
import sys

from qwen27b.controller import oporder


def _frame_of(path):
    """A frame of code exec'd from `path`, as pyinfra's CLI runs the deploy file."""
    code = compile("import sys\nframe = sys._getframe()\n", str(path), "exec")
    scope = {"__file__": str(path)}
    exec(code, scope)  # noqa: S102
    return scope["frame"]


def test_the_deploy_file_is_found_as_a_module(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "deploy.py").write_text("import sys\nframe = sys._getframe()\n")
    frame = _frame_of("deploy.py")  # relative, as the CLI passes it
    assert inspect.getmodule(frame, "deploy.py") is None  # no module has that file: a scan each time
    oporder.register_deploy_file("deploy.py")
    oporder.register_deploy_file("deploy.py")  # idempotent
    name = oporder.module_name(str(tmp_path / "deploy.py"))
    try:
        module = inspect.getmodule(frame, "deploy.py")
        assert module is sys.modules[name] and module.__file__ == str(tmp_path / "deploy.py")
        # what getframeinfo reports (file, line, code) is as before: the module adds no loader
        info = inspect.getframeinfo(frame)
        assert (info.filename, info.lineno, info.code_context) == ("deploy.py", 2, ["frame = sys._getframe()\n"])
        assert [n for n in sys.modules if n.startswith(oporder.PREFIX)].count(name) == 1
    finally:
        sys.modules.pop(name, None)


def test_api_mode_has_no_deploy_file():
    before = set(sys.modules)
    oporder.register_deploy_file(None)
    assert set(sys.modules) == before
