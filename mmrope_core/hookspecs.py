"""The hooks a plugin may implement.

Each spec is an empty function whose docstring is the contract. A plugin's implementation may
take fewer arguments than the spec lists; pluggy passes only those it names, so a spec can grow
without breaking plugins. Hooks are called through pluggy: ``tryfirst``/``trylast`` order them,
and wrappers (``@hookimpl(wrapper=True)``) may wrap what the other plugins return. Plugins are
discovered through the ``mmrope`` entry-point group:

.. code-block:: toml

    [project.entry-points.mmrope]
    my_family = "mmrope_my_family"
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pluggy

from .batching import BatchLayout
from .types import ExampleCase, RopeBinding, ValidationPolicy

PROJECT_NAME = "mmrope"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec(firstresult=True)
def bind_rope_index(processor: Any, config: Any, options: Mapping[str, Any]) -> RopeBinding | None:
    """Claim a processor and say how its positions are computed.

    Called once when an engine is built. Return a :class:`RopeBinding` when the plugin
    recognises ``processor`` (by its class or its capabilities), None otherwise. The first
    binding returned wins; plugins that declare one processor class in ``PROCESSOR_CLASSES``
    are listed as a conflict by ``mmrope plugins``, in the order they are asked.

    Args:
        processor: the Hugging Face processor the trainer uses.
        config: the model config, or None. Plugins document the defaults they assume without it
            and unwrap nested configs (e.g. an Omni ``thinker_config``) themselves.
        options: read-only keyword options given to ``RopeEngine.from_processor``, e.g.
            ``{"implementation": "reference"}``. Read the ones you know
            (``options.get("implementation", "fast")``); an option the binding plugin never
            reads is refused with ``UnknownOptionError``.

    Example::

        @hookimpl
        def bind_rope_index(processor, config, options):
            if type(processor).__name__ != "MyVLProcessor":
                return None
            from mmrope_core.mrope import MropeFamily, MropeKernel   # heavy imports inside the hook
            family = MropeFamily("My-VL", spatial_merge_size=2, image_token_id=processor.image_token_id,
                                 image_key="image_grids")
            return RopeBinding("mrope", MropeKernel(family))
    """


@hookspec
def get_rope_index_kwargs(
    processor: Any, multi_modal_inputs: Mapping[str, Any], mm_processor_kwargs: Mapping[str, Any]
) -> dict[str, Any] | None:
    """The keyword arguments of the bound kernel's ``rope_index``, derived from one batch's inputs.

    Called on every ``compute_position_ids``. Return None when the processor is not yours or
    nothing is needed. Results of every plugin are merged; two plugins giving different values
    for one key is a :class:`~mmrope_core.errors.PluginConflictError` naming both.

    Args:
        processor: the engine's processor.
        multi_modal_inputs: a read-only mapping of the processor's outputs (``image_grid_thw``,
            ``feature_attention_mask``, ...). Tensors read from it are copies: changing them
            cannot change the caller's data.
        mm_processor_kwargs: read-only keyword arguments the processor was called with
            (e.g. ``use_audio_in_video``).

    Example::

        @hookimpl
        def get_rope_index_kwargs(processor, multi_modal_inputs):
            if type(processor).__name__ != "MyOmniProcessor":
                return None
            mask = multi_modal_inputs.get("feature_attention_mask")
            return {} if mask is None else {"audio_seqlens": mask.sum(-1)}
    """


@hookspec(firstresult=True)
def validate_inputs_policy(processor: Any) -> ValidationPolicy | None:
    """How strictly the processor's own input validation runs inside ``engine.process``.

    Trainers re-run the processor on text whose placeholders were collapsed to one token per
    image; a processor that insists on one placeholder per soft token then rejects valid input.
    Return a :class:`ValidationPolicy` for processors you own, None otherwise (the processor's
    check then runs unchanged). The engine applies the policy to a private copy of the processor;
    the user's object is never changed.

    Example::

        @hookimpl
        def validate_inputs_policy(processor):
            if type(processor).__name__ == "MyProcessor":
                return ValidationPolicy(strict=False, validate=count_images_only,
                                        reason="placeholders are expanded by the processor itself")
    """


@hookspec
def varlen_keys(processor: Any) -> Iterable[str] | None:
    """Multimodal input keys whose last dimension varies per sample.

    ``engine.collate`` zero-pads these on the last dimension before concatenating samples.
    The union over all plugins is used. Return None (or nothing) for processors not yours.

    Example::

        @hookimpl
        def varlen_keys(processor):
            if type(processor).__name__ == "MyOmniProcessor":
                return {"input_features", "feature_attention_mask"}
    """


@hookspec(firstresult=True)
def batch_layout(processor: Any, config: Any) -> BatchLayout | None:
    """How the model takes a batch: what the family's media keys hold (a
    :class:`~mmrope_core.batching.MediaKey` ``role``: grids, seconds, audio lengths, audio
    masks; and its ``medium``: the image, video or audio items it holds one entry of each, by
    which the trainers' drop-ins share a batch out among its samples), the keys its processor
    batches otherwise than the common way (every key concatenated on dim 0, varying dims
    zero-padded), and the padding side its layers get wrong.

    Called once when an engine is built. Return a :class:`~mmrope_core.batching.BatchLayout`
    for processors you bound, None otherwise. The engine reads and checks every key declared
    with a role, whatever its name, before any hook or kernel sees it (a key no plugin declares
    is passed on unread); its ``batch``/``collate`` and both collators follow the batching
    rules, and the processor's own batched call is what they must reproduce.

    Example::

        @hookimpl
        def batch_layout(processor, config):
            if type(processor).__name__ == "MyStripProcessor":  # one (1, 3, 14, W) strip per sample
                return BatchLayout(media={"pixel_values": MediaKey(join="last"), "strip_grid": IMAGE_GRID})
    """


@hookspec
def example_cases() -> Iterable[ExampleCase] | None:
    """Tiny real processors this plugin handles, built offline, with inputs for them.

    ``mmrope demo`` shows positions for each, and the conformance checks run on them. Keep
    imports inside the builders so listing plugins stays cheap.

    Example::

        @hookimpl
        def example_cases():
            return [ExampleCase("My-VL", build=build_tiny_processor, samples=random_samples)]
    """
