"""mmrope inside trainers that have their own place for position ids.

``mmrope_core.integrations.verl``: a drop-in for verl's processor factory;
``mmrope_core.integrations.llamafactory``: for LLaMA-Factory's multimodal collators;
``mmrope_core.integrations.swift``: for ms-swift's templates;
``mmrope_core.integrations.megatron_bridge``: for Megatron-Bridge's Qwen-VL models;
``mmrope_core.integrations.megatron``: Megatron-core's context-parallel batch cutters, cutting
positions on their last dim. Importing this package imports no trainer.
"""
