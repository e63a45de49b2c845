"""Every distribution as a user or a packager gets it: sdists that carry their own tests and
licence, an install without a C compiler, a fresh virtual environment with pip's build
isolation, and a pytest entry point that costs unrelated projects nothing."""

import os
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
DISTRIBUTIONS = {
    "mmrope_core": ROOT,
    "mmrope_qwen_vl": ROOT / "mmrope_plugins" / "qwen_vl",
    "mmrope_gemma4": ROOT / "mmrope_plugins" / "gemma4",
    "mmrope_qwen3_omni": ROOT / "mmrope_plugins" / "qwen3_omni",
    "mmrope_transformers": ROOT / "mmrope_plugins" / "transformers",
    "mmrope_paddleocr_vl": ROOT / "examples" / "third_party_plugin",
    "mmrope_storyboard": ROOT / "examples" / "storyboard_plugin",
}


def run(*command, cwd=None, env=None, check=True):
    result = subprocess.run([str(part) for part in command], cwd=cwd, capture_output=True, text=True,
                            env={**os.environ, **(env or {})})
    if check:
        assert result.returncode == 0, f"{' '.join(map(str, command))}\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """An sdist and a wheel of every distribution, built as a packager builds them."""
    out = tmp_path_factory.mktemp("dist")
    for source in DISTRIBUTIONS.values():
        run(sys.executable, "-m", "build", "--no-isolation", "--outdir", out, source, cwd=source)
    return out


def sdist_names(built, name):
    with tarfile.open(built / f"{name}-0.1.0.tar.gz") as archive:
        return {member.split("/", 1)[1] for member in archive.getnames() if "/" in member}


@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS))
def test_every_sdist_carries_its_licence_and_its_own_tests(built, name):
    names = sdist_names(built, name)
    assert "LICENSE" in names
    tests = {path for path in names if path.startswith("tests/") and path.endswith(".py")}
    assert tests == {str(path.relative_to(DISTRIBUTIONS[name])) for path in (DISTRIBUTIONS[name] / "tests").rglob("*.py")
                     if "integration" not in path.parts and "trainers" not in path.parts}


def test_the_core_sdist_ships_no_plugin_or_integration_tests(built):
    names = sdist_names(built, "mmrope_core")
    assert not any(path.startswith(("mmrope_plugins/", "examples/", "tests/integration", "tests/trainers"))
                   for path in names)
    sources = {f"mmrope_core/csrc/{path.name}" for path in (ROOT / "mmrope_core" / "csrc").iterdir()}
    assert sources <= names and any(name.endswith(".h") for name in sources)  # an sdist must build the extension


def test_the_core_wheel_built_from_its_sdist_holds_the_compiled_loops_and_no_sources(built):
    with zipfile.ZipFile(next(built.glob("mmrope_core-0.1.0-*.whl"))) as archive:
        names = archive.namelist()
    assert any(name.startswith("mmrope_core/_native") and name.endswith(".so") for name in names)
    assert not any(name.startswith("mmrope_core/csrc/") for name in names)


@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS))
def test_every_wheel_names_its_licence_in_its_metadata(built, name):
    wheel = next(built.glob(f"{name}-0.1.0-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        metadata = archive.read(f"{name}-0.1.0.dist-info/METADATA").decode()
        assert "License-Expression: Apache-2.0" in metadata and "License-File: LICENSE" in metadata
        assert "Apache License" in archive.read(f"{name}-0.1.0.dist-info/licenses/LICENSE").decode()
        assert not any(path.startswith("tests/") for path in archive.namelist())
        assert "transformers<" not in metadata.replace(" ", "")  # no cap on future transformers


@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS))
def test_the_tests_of_every_sdist_run_from_it(built, name, tmp_path):
    with tarfile.open(built / f"{name}-0.1.0.tar.gz") as archive:
        archive.extractall(tmp_path, filter="data")
    unpacked = tmp_path / f"{name}-0.1.0"
    # collecting imports every test module and its helpers: what an sdist lacks fails here
    result = run(sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests", cwd=unpacked)
    assert " collected" in result.stdout or "tests collected" in result.stdout, result.stdout


def bare_environment(path):
    """A virtual environment that sees this one's dependencies but not its mmrope installs."""
    run(sys.executable, "-m", "venv", "--without-pip", path)
    site = next(path.glob("lib/python*/site-packages"))
    dependencies = next(Path(p) for p in sys.path if p.endswith("site-packages") and Path(p, "torch").is_dir())
    (site / "dependencies.pth").write_text(f"{dependencies}\n")  # its .pth files (editable installs) are not read
    return path / "bin" / "python", site


def test_the_core_installs_and_computes_without_a_c_compiler(built, tmp_path):
    python, target = bare_environment(tmp_path / "venv")
    run(sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index", "--target", target,
        built / "mmrope_core-0.1.0.tar.gz", env={"CC": "false", "LDSHARED": "false"})
    assert not list(target.glob("mmrope_core/_native*.so"))
    code = textwrap.dedent("""
        import warnings
        import torch
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            from mmrope_core import RopeEngine
            engine = RopeEngine.from_processor(None)
            positions = engine.compute_position_ids(torch.tensor([[5, 6, 7]]), torch.tensor([[1, 1, 0]]))
            from mmrope_core.mrope import TokenTypeMap
            TokenTypeMap({6: 1})(torch.tensor([[5, 6, 7]]))
        print(positions.tolist(), [str(w.message) for w in caught if w.category.__name__ == "CompiledLoopsWarning"])
    """)
    result = run(python, "-c", code, cwd=tmp_path)
    positions, warned = result.stdout.strip().split(" [", 1)
    assert positions == "[[0, 1, 1]]"
    assert warned.count("compiled CPU loops") == 1 and "only slower" in warned


def test_a_new_user_installs_with_pip_and_runs_demo_and_check(built, tmp_path):
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv)
    pip = [venv / "bin" / "python", "-m", "pip", "install", "-q"]
    run(*pip, "torch==2.13.0")
    # build isolation, no extras but the demo's, as a user installs from a checkout
    run(*pip, f"{ROOT}[demo]", ROOT / "mmrope_plugins" / "qwen_vl", cwd=tmp_path)
    mmrope = venv / "bin" / "mmrope"
    assert run(mmrope, "--version", cwd=tmp_path).stdout.strip() == "mmrope 0.1.0"
    verdict = run(mmrope, "check", "qwen_vl", "--quiet", cwd=tmp_path).stdout.strip()
    assert verdict.startswith("qwen_vl: conforms (9 example processors, ") and "\n" not in verdict
    demo = run(mmrope, "demo", cwd=tmp_path).stdout
    assert "9 of 9 families shown." in demo and demo.count("equal to the transformers reference: yes") == 9
    # a packager runs a plugin's tests from its sdist with nothing but its [test] extra installed
    sdist = built / "mmrope_gemma4-0.1.0.tar.gz"
    run(*pip, f"mmrope_gemma4[test] @ {sdist.as_uri()}", cwd=tmp_path)
    with tarfile.open(sdist) as archive:
        archive.extractall(tmp_path, filter="data")
    tests = run(venv / "bin" / "python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests",
                cwd=tmp_path / "mmrope_gemma4-0.1.0")
    assert " passed" in tests.stdout and "failed" not in tests.stdout, tests.stdout


UNRELATED_TEST = """
import sys

import pytest


def test_unrelated():
    assert "torch" not in sys.modules and "transformers" not in sys.modules


@pytest.mark.applies  # a marker of the project's own, named like none of mmrope's
def test_with_a_marker_of_its_own():
    pass


@pytest.mark.applies(0)
def test_with_a_marker_of_its_own_and_an_argument():
    pass
"""


def test_an_unrelated_pytest_run_imports_no_torch(tmp_path):
    (tmp_path / "test_unrelated.py").write_text(UNRELATED_TEST)
    result = run(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", cwd=tmp_path, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 passed" in result.stdout, result.stdout
    assert "mmrope_core.testing.pytest_plugin" in run(sys.executable, "-m", "pytest", "--trace-config", "-q",
                                                      "-p", "no:cacheprovider", cwd=tmp_path, check=False).stdout


def test_a_broken_mmrope_install_does_not_break_an_unrelated_pytest_run(tmp_path):
    (tmp_path / "test_unrelated.py").write_text(UNRELATED_TEST)
    broken = tmp_path / "broken"
    for module in ("torch", "transformers", "importlib_metadata"):  # what mmrope needs, each failing on import
        (broken / module).mkdir(parents=True)
        (broken / module / "__init__.py").write_text(f"raise ImportError('{module} is broken')\n")
    result = run(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", cwd=tmp_path, check=False,
                 env={"PYTHONPATH": broken})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 passed" in result.stdout, result.stdout
