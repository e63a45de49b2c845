"""mmrope plugin for every vision-language model of the installed transformers, by capability.

A processor is bound by what its model config says, looked up in transformers' own auto
mappings: a model class whose ``forward`` computes positions with ``get_rope_index`` gets that
method as the reference kernel, or the core's batched kernel where probing proves it equal; a
model without M-RoPE gets 1-D positions. Family plugins answer first (this plugin's
``bind_rope_index`` is ``trylast``). Without a config the plugin declines: a processor does not
say which model it feeds.

transformers is imported only inside the hooks, so discovering this plugin is cheap.
"""

from __future__ import annotations

from typing import Any

from mmrope_core import hookimpl

#: This plugin claims no processor class by name: ``mmrope plugins --models`` lists what it binds.
PROCESSOR_CLASSES: tuple[str, ...] = ()


@hookimpl(trylast=True)
def bind_rope_index(processor: Any, config: Any, options: Any):
    from .bind import bind

    return bind(processor, config, options)


@hookimpl
def get_rope_index_kwargs(processor: Any, multi_modal_inputs: Any, mm_processor_kwargs: Any):
    from .bind import bound

    what = bound(processor)
    if what is None or not what.rope_arguments:
        return None
    given = {key: multi_modal_inputs[key] for key in what.rope_arguments if key in multi_modal_inputs}
    given.update({key: mm_processor_kwargs[key] for key in what.rope_arguments
                  if key in mm_processor_kwargs and key not in given})
    return given


@hookimpl
def varlen_keys(processor: Any):
    from .bind import bound

    what = bound(processor)
    return None if what is None else what.varlen_keys


@hookimpl
def batch_layout(processor: Any, config: Any):
    from mmrope_core.batching import COMMON

    from .batching import layout_of
    from .bind import bound

    what = bound(processor)
    return None if what is None else (layout_of(processor, config) or COMMON).with_media(what.media_keys)


@hookimpl
def example_cases():
    from .examples import example_cases as cases

    return cases()
