import os

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
torch.set_num_threads(1)  # two cores, shared


def pytest_configure(config):
    # TRL's SFTConfig passes transformers a deprecated argument name of its own
    config.addinivalue_line("filterwarnings", "ignore:`gradient_checkpointing` is deprecated:FutureWarning")
