# Four environments, each built from nothing: the demo's (.venv-demo: mmrope-core and its plugins,
# Pillow and tokenizers, nothing else), and the tests': the newest supported transformers (.venv),
# the oldest (.venv-oldest), and the trainers' (.venv-trainers: verl 0.9.1, LLaMA-Factory 0.9.5,
# ms-swift 4.6.0, Megatron-core, Megatron-Bridge, mcore-bridge, Ray, datasets, on the transformers
# verl allows). The tests' environments also
# install the third-party example plugins (PaddleOCR-VL's binding would shadow mmrope-transformers').
PYTHON ?= python3
FAMILY_PLUGINS := $(patsubst %/pyproject.toml,%,$(wildcard mmrope_plugins/*/pyproject.toml))
PLUGINS := $(FAMILY_PLUGINS) examples/third_party_plugin examples/storyboard_plugin
EDITABLE := -e . $(addprefix -e ./,$(PLUGINS))
# runs the install commands docs/trainers.md gives users
INSTALL_FROM_DOCS := tests/trainers/install_commands.py
SOURCES := pyproject.toml $(wildcard mmrope_core/csrc/*) $(addsuffix /pyproject.toml,$(PLUGINS))

# CPU torch on any machine: pip's plain torch is a CUDA build of several GB. The pinned release
# comes from the CPU wheel index where that answers within a few seconds; elsewhere from the
# plain pin (a machine whose pip has a CPU wheel at hand, in a local index or wheel directory).
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_SOURCE = $(shell $(PYTHON) -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + '/torch/', timeout=5)" \
	'$(TORCH_CPU_INDEX)' >/dev/null 2>&1 && echo '--index-url $(TORCH_CPU_INDEX)')
# $(call new_venv,DIR,REQUIREMENTS): a fresh environment with CPU torch, then the requirements
define new_venv
	$(PYTHON) -m venv $(1)
	$(1)/bin/pip install -q $(TORCH_SOURCE) $$(grep '^torch==' $(2))
	$(1)/bin/pip install -q -r $(2)
endef

.PHONY: demo test test-newest test-oldest test-without-compiled test-trainers lint bench clean

demo: .venv-demo/.installed
	.venv-demo/bin/mmrope demo

.venv-demo/.installed: requirements/demo.txt pyproject.toml $(wildcard mmrope_core/csrc/*) $(addsuffix /pyproject.toml,$(FAMILY_PLUGINS))
	$(call new_venv,.venv-demo,requirements/demo.txt)
	.venv-demo/bin/pip install -q --no-build-isolation -e . $(addprefix -e ./,$(FAMILY_PLUGINS))
	touch $@

test: lint test-newest test-without-compiled test-oldest test-trainers

test-newest: .venv/.installed
	.venv/bin/python -m pytest -q -p no:cacheprovider

# The differential tests again with the compiled CPU loops switched off: both paths stay equal.
test-without-compiled: .venv/.installed
	MMROPE_DISABLE_COMPILED=1 .venv/bin/python -m pytest -q -p no:cacheprovider -m differential

# The differential tests again on the oldest supported transformers, whose semantics differ
# (the padding-free trainer tests need TRL, which the newest environment holds).
test-oldest: .venv-oldest/.installed
	.venv-oldest/bin/python -m pytest -q -p no:cacheprovider -m differential --ignore=tests/padding_free

# verl's agent-loop code, LLaMA-Factory's collators and ms-swift's templates, Ray actors, Ray Data
# and datasets with real engines, and the examples.
test-trainers: .venv-trainers/.installed
	.venv-trainers/bin/python -m pytest -q -p no:cacheprovider tests/trainers

lint: .venv/.installed
	.venv/bin/ruff check mmrope_core mmrope_plugins examples tests/trainers tests/padding_free tests/models tests/test_collators.py
	.venv/bin/mypy

bench: .venv/.installed
	.venv/bin/python benchmarks/qwen_vl.py
	.venv/bin/python benchmarks/qwen_omni.py
	.venv/bin/python benchmarks/packing.py
	.venv/bin/python benchmarks/transformers_families.py
	.venv/bin/python benchmarks/padding_free.py
	.venv/bin/python benchmarks/parallel.py

.venv/.installed: requirements/newest.txt docs/trainers.md $(INSTALL_FROM_DOCS) $(SOURCES)
	$(call new_venv,.venv,requirements/newest.txt)
	.venv/bin/python $(INSTALL_FROM_DOCS) trl
	.venv/bin/pip install -q --no-build-isolation $(EDITABLE)
	touch $@

.venv-oldest/.installed: requirements/oldest.txt $(SOURCES)
	$(call new_venv,.venv-oldest,requirements/oldest.txt)
	.venv-oldest/bin/pip install -q --no-build-isolation $(EDITABLE)
	touch $@

# The trainers themselves are installed by the commands docs/trainers.md gives users (its
# `<!-- install: NAME -->` blocks); requirements/trainers.txt holds what only the tests need.
.venv-trainers/.installed: requirements/trainers.txt docs/trainers.md $(INSTALL_FROM_DOCS) $(SOURCES)
	$(call new_venv,.venv-trainers,requirements/trainers.txt)
	.venv-trainers/bin/python $(INSTALL_FROM_DOCS) verl llamafactory swift megatron
	.venv-trainers/bin/pip install -q --no-build-isolation $(EDITABLE)
	touch $@

clean:
	rm -rf .venv-demo .venv .venv-oldest .venv-trainers
