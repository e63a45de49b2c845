"""mmrope inside trainers that have their own place for position ids.

``mmrope_core.integrations.verl``: a drop-in for verl's processor factory. Importing this package
imports no trainer.
"""
