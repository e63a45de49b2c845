"""A plugin that raises inside a hook at call time."""

from mmrope_core import hookimpl


@hookimpl
def get_rope_index_kwargs(processor, multi_modal_inputs):
    return {"broken": 1 / len([])}
