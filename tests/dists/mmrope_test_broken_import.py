"""A plugin whose import fails, as when its dependency is missing."""

import mmrope_dependency_that_is_not_installed  # noqa: F401
