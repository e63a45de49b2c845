"""``python -m mmrope_core.integrations.swift`` prints the path of the file to pass to ms-swift's
``--external_plugins``."""

from pathlib import Path

print(Path(__file__).with_name("plugin.py"))
