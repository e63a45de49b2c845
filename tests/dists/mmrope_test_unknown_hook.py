"""A plugin implementing a hook that does not exist (a typo of bind_rope_index)."""

from mmrope_core import hookimpl


@hookimpl
def bind_rope_indx(processor, config):
    return None
