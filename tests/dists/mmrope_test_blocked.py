"""A plugin that must never be imported when blocked: importing it fails loudly."""

raise RuntimeError("mmrope_test_blocked was imported although it is disabled")
