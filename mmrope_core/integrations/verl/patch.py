"""Importing this module makes verl build its processors with mmrope's drop-in.

Meant for verl's ``external_lib`` config entry, which verl imports in every process right before
it builds the processor::

    actor_rollout_ref.model.external_lib=mmrope_core.integrations.verl.patch
"""

from . import install

install()
