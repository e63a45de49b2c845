"""The file ms-swift's ``--external_plugins`` option loads: it installs mmrope's positions in
ms-swift's templates (:func:`mmrope_core.integrations.swift.install`)::

    swift sft ... --external_plugins "$(python -m mmrope_core.integrations.swift)"

``MMROPE_CONVENTION`` in the environment names the position convention (``vllm`` for GRPO with
vLLM rollouts; see :mod:`mmrope_core.conventions`); unset or empty, transformers'. A name mmrope
does not know stops ms-swift as it loads this file (:class:`~mmrope_core.UnknownConventionError`).

ms-swift loads the file by path under a name of its own, so it imports by absolute name.
"""

import os

from mmrope_core.conventions import known
from mmrope_core.integrations.swift import install

install(convention=known(os.environ.get("MMROPE_CONVENTION") or None, "the environment's MMROPE_CONVENTION"))
