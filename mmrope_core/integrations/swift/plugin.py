"""The file ms-swift's ``--external_plugins`` option loads: it installs mmrope's positions in
ms-swift's templates (:func:`mmrope_core.integrations.swift.install`)::

    swift sft ... --external_plugins "$(python -m mmrope_core.integrations.swift)"

ms-swift loads the file by path under a name of its own, so it imports by absolute name.
"""

from mmrope_core.integrations.swift import install

install()
