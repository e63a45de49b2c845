"""The trainers page shows code that runs: each python block is part of a tested example."""

from pathlib import Path

ROOT = Path(__file__).parents[2]
TESTED_ELSEWHERE = ("# my_verl_setup.py",)  # test_verl.py runs it as verl's external_lib


def python_blocks():
    text = (ROOT / "docs" / "trainers.md").read_text()
    return [block.split("```", 1)[0] for block in text.split("```python\n")[1:]]


def test_every_python_block_is_taken_from_an_example():
    examples = {path.name: path.read_text() for path in (ROOT / "examples").glob("*.py")}
    blocks = [block for block in python_blocks() if not block.startswith(TESTED_ELSEWHERE)]
    assert len(blocks) >= 7
    for block in blocks:
        lines = [line.strip() for line in block.splitlines() if line.strip()]
        sources = [name for name, text in examples.items() if all(line in text for line in lines)]
        assert sources, f"not found in any example:\n{block}"


def test_every_example_is_on_the_page():
    text = (ROOT / "docs" / "trainers.md").read_text()
    for path in (ROOT / "examples").glob("*.py"):
        assert f"examples/{path.name}" in text or f"`{path.name}`" in text, path.name


def test_this_environment_holds_the_releases_the_install_commands_pin():
    """The trainers' environment is built by the page's install commands (install_commands.py)."""
    import importlib.metadata

    from install_commands import commands

    pins = {}
    for name in ("verl", "llamafactory", "swift", "megatron"):
        for arguments in commands()[name]:
            pins.update(word.split("==") for word in arguments if "==" in word)
    assert {"verl", "llamafactory", "ms-swift", "transformers", "megatron-core", "mcore-bridge"} <= set(pins)
    assert {package: importlib.metadata.version(package) for package in pins} == pins
