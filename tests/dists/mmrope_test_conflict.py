"""Two plugins that give different values for the same rope argument."""

import types

from mmrope_core import hookimpl


def _plugin(offset):
    @hookimpl
    def get_rope_index_kwargs(processor, multi_modal_inputs):
        return {"offset": offset}

    return types.SimpleNamespace(get_rope_index_kwargs=get_rope_index_kwargs)


first = _plugin(10)
second = _plugin(20)
