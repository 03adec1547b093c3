"""pyproject.toml: `pip install .` installs every package of the source tree and one console
command per binary, whose --help lists that binary's flags (as `python -m` does), and the
extras pin what requirements-test.txt pins.

The install goes to a directory (`pip install --target`, offline, no dependencies) from a
copy of the checkout, so the checkout gets no build/ nor egg-info.
"""

import os
import shutil
import subprocess
import sys
import tomllib

import pytest
from binary_fixtures import help_blocks, project_flags
from model_fixtures import REPO_ROOT

with open(os.path.join(REPO_ROOT, "pyproject.toml"), "rb") as _f:
    PROJECT = tomllib.load(_f)
SCRIPTS = PROJECT["project"]["scripts"]
SETUPTOOLS = PROJECT["tool"]["setuptools"]


def _source_of(module: str) -> tuple[str, str]:
    """An installed module -> (its `python -m` name in the checkout, its file there)."""
    package, _, rest = module.partition(".")
    directory = SETUPTOOLS["package-dir"].get(package, package)
    name = directory if rest == "__main__" else f"{directory}.{rest}" if rest else directory
    return name, os.path.join(REPO_ROOT, directory, *rest.split(".")) + ".py"


def test_the_commands_and_their_binaries():
    assert set(SCRIPTS) == {f"tf-transformer-{name}" for name in (
        "train", "translate", "evaluate", "score", "average", "export")}
    assert all(target.endswith(":run") for target in SCRIPTS.values())
    assert _source_of(SCRIPTS["tf-transformer-export"].split(":")[0]) == (
        "export", os.path.join(REPO_ROOT, "export", "__main__.py"))


def test_every_package_of_the_source_tree_is_installed():
    packages = {os.path.relpath(folder, REPO_ROOT).replace(os.sep, ".")
                for folder, _, files in os.walk(os.path.join(REPO_ROOT, "tf_transformer"))
                if "__init__.py" in files}
    assert set(SETUPTOOLS["packages"]) == packages | set(SETUPTOOLS["package-dir"])


def _pins(path: str) -> dict[str, str]:
    pins = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            requirement = line.split("#")[0].strip()
            if "==" in requirement:
                name, version = requirement.split("==")
                pins[name.strip()] = version.strip()
    return pins


def test_dependencies_are_requirements_txt_and_extras_pin_the_test_requirements():
    assert PROJECT["project"]["dynamic"] == ["dependencies"]
    assert PROJECT["tool"]["setuptools"]["dynamic"]["dependencies"] == {
        "file": ["requirements.txt"]}
    tested = _pins(os.path.join(REPO_ROOT, "requirements-test.txt"))
    extras = _pins_of([r for extra in PROJECT["project"]["optional-dependencies"].values()
                       for r in extra])
    assert extras and all(tested[name] == version for name, version in extras.items())


def _pins_of(requirements: list[str]) -> dict[str, str]:
    return dict(tuple(part.strip() for part in r.split("==")) for r in requirements)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """`pip install --no-deps --no-build-isolation --no-index --target=SITE` of a copy."""
    root = tmp_path_factory.mktemp("install")
    source = root / "source"
    source.mkdir()
    for name in ("pyproject.toml", "requirements.txt", "README.md"):
        shutil.copy(os.path.join(REPO_ROOT, name), source / name)
    for package in ("tf_transformer", *SETUPTOOLS["package-dir"].values()):
        shutil.copytree(os.path.join(REPO_ROOT, package), source / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    site = root / "site"
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
         "--no-build-isolation", "--no-index", f"--target={site}", str(source)],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return site


def _run(command, cwd, **env):
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **env))


@pytest.mark.slow
@pytest.mark.parametrize("command", sorted(SCRIPTS))
def test_each_console_command_lists_its_binarys_flags(installed, command):
    module = SCRIPTS[command].split(":")[0]
    name, path = _source_of(module)
    if not os.path.exists(path):
        pytest.skip(f"{path} is not in this checkout")
    expected = project_flags(_run([sys.executable, "-m", name, "--helpxml"], REPO_ROOT).stdout)
    assert expected
    # Run from elsewhere with the install first on the path: the installed copy answers.
    shown = _run([str(installed / "bin" / command), "--help"], installed.parent,
                 PYTHONPATH=str(installed))
    assert sorted(expected) == sorted(set(expected) & set(help_blocks(shown.stdout)))
    with open(path, encoding="utf-8") as f:
        first_line = f.read().split('"""')[1].splitlines()[0]
    assert shown.stdout.startswith(first_line)  # the binary's docstring, not the launcher's
    assert "python -m" not in open(installed / "bin" / command, encoding="utf-8").read()


@pytest.mark.slow
def test_the_install_holds_the_package_data_the_binaries_read(installed):
    assert sorted(os.listdir(installed / "tf_transformer" / "recipes")) == sorted(
        os.listdir(os.path.join(REPO_ROOT, "tf_transformer", "recipes")))
    assert (installed / "tf_transformer_export" / "serving" / "warmup_sentences.txt").exists()
