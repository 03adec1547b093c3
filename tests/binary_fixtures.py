"""Shared by the binary tests: every binary of the repository (`binaries`), the flags a
binary's --helpxml says this repository defines, the flag blocks of its --help
(test_binaries.py, test_packaging.py, test_layout.py), and `run_main`, a
binary run in this process (a subprocess is for what only a process shows: exit by
signal, a pipe, TF_CONFIG clusters, --help)."""

import contextlib
import importlib
import importlib.util
import io
import logging
import os
import re
import sys
import traceback
import xml.etree.ElementTree as ElementTree

from absl import app, flags
from absl import logging as absl_logging

from model_fixtures import REPO_ROOT

PACKAGES = ("tf_transformer", "export", "data")  # where binaries live


def project_flags(helpxml: str) -> dict[str, str]:
    """name -> help text of the flags defined by this repository's modules."""
    flags = {}
    for flag in ElementTree.fromstring(helpxml).iter("flag"):
        where = flag.findtext("file")
        if where.startswith(REPO_ROOT) or where.split(".")[0] in PACKAGES:
            flags[flag.findtext("name")] = flag.findtext("meaning")
    return flags


def help_blocks(help_text: str) -> dict[str, str]:
    """--help's flags: "  --name: help" or "  --[no]name: help", then indented lines."""
    return dict(re.findall(r"^  --(?:\[no\])?(\w+): (.*(?:\n    .*)*)", help_text, re.M))


def binaries() -> dict[str, str]:
    """module name -> path of every module under PACKAGES that calls app.run when run
    (itself, or through flags.run_binary)."""
    found = {}
    for package in PACKAGES:
        for name in sorted(os.listdir(os.path.join(REPO_ROOT, package))):
            path = os.path.join(REPO_ROOT, package, name)
            text = open(path, encoding="utf-8").read() if name.endswith(".py") else ""
            runs = "app.run(" in text or "flags_lib.run_binary(main, __name__)" in text
            if runs and 'if __name__ == "__main__":' in text:
                module = package if name == "__main__.py" else f"{package}.{name[:-3]}"
                found[module] = path
    return found


# --- Binaries in this process: a binary's flags live in absl's global FLAGS only while it runs.
def run_main(module: str, argv: list[str], stdin: bytes = b"",
             env: dict[str, str] | None = None) -> dict:
    """Runs the binary `module` (e.g. "tf_transformer.translate") in this process as
    `python -m module *argv` runs it (absl's app.run of its main, without os._exit): flags
    parsed (a bad flag: usage on stderr, code 1), main called (an app.UsageError: the short
    usage and the message on stderr, code 1; an exception: its traceback, code 1).

    The module is imported afresh and its flags are deleted afterwards, so binaries that
    define the same flags run one after the other; os.environ (`env`: the run's environment,
    default the current one), sys.argv and the standard streams are restored.
    Returns {"code": exit code, "stdout": str, "stderr": str (absl's log lines included)}."""
    with _log_levels(), binary_module(module) as binary, _environment(env), \
            _streams(stdin) as (out, err):
        code = _run_absl_main(binary.main, [module, *argv])
    return {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()}


def run_mains(module: str, argvs: list[list[str]], env: dict[str, str] | None = None
              ) -> list[dict]:
    """`run_main(module, argv, env=env)` for each argv, in order."""
    return [run_main(module, argv, env=env) for argv in argvs]


@contextlib.contextmanager
def binary_module(module: str):
    """The binary's module imported afresh: its flags defined in absl's FLAGS for the block,
    then unparsed and deleted (with the module, so that the next import defines them)."""
    if importlib.util.find_spec(module).submodule_search_locations is not None:
        module += ".__main__"  # a package: what `python -m package` runs
    before = set(flags.FLAGS)
    sys.modules.pop(module, None)
    try:
        yield importlib.import_module(module)
    finally:
        flags.FLAGS.unparse_flags()
        for name in set(flags.FLAGS) - before:
            delattr(flags.FLAGS, name)
        sys.modules.pop(module, None)


@contextlib.contextmanager
def _environment(env: dict[str, str] | None):
    """os.environ is `env` in the block (the binaries' process_defaults.apply() sets
    variables), then what it was."""
    saved, saved_argv = dict(os.environ), sys.argv
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
        sys.argv = saved_argv


class _Text(io.TextIOWrapper):
    """A text stream over bytes, with the `.buffer` the binaries read and write."""

    def __init__(self, data: bytes = b""):
        super().__init__(io.BytesIO(data), encoding="utf-8", errors="replace",
                         write_through=True)

    def getvalue(self) -> str:
        self.flush()
        return self.buffer.getvalue().decode("utf-8", errors="replace")


@contextlib.contextmanager
def _streams(stdin: bytes):
    """stdin read from `stdin`; stdout and stderr captured, absl's log lines into stderr."""
    out, err = _Text(), _Text()
    handler = absl_logging.get_absl_handler()
    saved_stdin, previous_stream = sys.stdin, handler.python_handler.setStream(err)
    logging.root.addHandler(handler)  # as app.run does
    sys.stdin = _Text(stdin)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            yield out, err
    finally:
        sys.stdin = saved_stdin
        logging.root.removeHandler(handler)
        handler.python_handler.setStream(previous_stream or sys.stderr)


@contextlib.contextmanager
def _log_levels():
    """The levels of the root logger and absl's, which --verbosity sets, restored."""
    absl_logger = absl_logging.get_absl_logger()
    levels = logging.root.level, absl_logger.level
    try:
        yield
    finally:
        logging.root.setLevel(levels[0])
        absl_logger.setLevel(levels[1])


def _run_absl_main(main, argv: list[str]) -> int:
    """app.run's path minus its once-per-process set-up (process name, log handler,
    faulthandler): the exit code."""
    app.define_help_flags()
    sys.argv = argv
    try:
        args = app.parse_flags_with_usage(argv)
        if flags.FLAGS["verbosity"].using_default_value:
            flags.FLAGS.verbosity = 0  # app.run's default: INFO
        try:
            return _exit_code(main(args))
        except app.UsageError as error:
            app.usage(shorthelp=True, detailed_error=error, exitcode=error.exitcode)
    except SystemExit as done:
        return _exit_code(done.code)
    except Exception:  # noqa: BLE001: a process would print it and exit 1
        traceback.print_exc()
        return 1
    return 0


def _exit_code(code) -> int:
    """The status sys.exit(code) gives a process (a message: printed to stderr, 1)."""
    if isinstance(code, str):
        print(code, file=sys.stderr)
        return 1
    return code or 0
