"""LLaMA-Factory's training with its collators taking M-RoPE positions from mmrope: the launcher
to use instead of ``llamafactory-cli train``, with the same YAML config.

    DISABLE_VERSION_CHECK=1 python examples/llamafactory_train.py my_qwen2_5_vl_sft.yaml
    DISABLE_VERSION_CHECK=1 torchrun --nproc_per_node 8 examples/llamafactory_train.py my_qwen2_5_vl_sft.yaml

(LLaMA-Factory 0.9.5 checks for transformers <=5.6; mmrope needs 5.10 or newer.)

Every process runs it, so every process installs the drop-in before LLaMA-Factory builds its
collator.
"""

from mmrope_core.integrations import llamafactory as mmrope_llamafactory


def main():
    mmrope_llamafactory.install()  # before LLaMA-Factory builds its collator
    from llamafactory.train.tuner import run_exp

    run_exp()  # reads the YAML config named on the command line, as llamafactory-cli does


if __name__ == "__main__":
    main()
