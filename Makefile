# Three environments, each built from nothing: the newest supported transformers (.venv), the
# oldest (.venv-oldest), and the trainers' (.venv-trainers: verl 0.9.1, LLaMA-Factory 0.9.5,
# ms-swift 4.6.0, Ray, datasets, on the transformers verl allows). Each installs mmrope-core, every
# plugin under mmrope_plugins/ and the third-party example plugins.
PYTHON ?= python3
PLUGINS := $(patsubst %/pyproject.toml,%,$(wildcard mmrope_plugins/*/pyproject.toml)) examples/third_party_plugin \
	examples/av_clip_plugin
EDITABLE := -e . $(addprefix -e ./,$(PLUGINS))
SOURCES := pyproject.toml $(wildcard mmrope_core/csrc/*) $(addsuffix /pyproject.toml,$(PLUGINS))

.PHONY: demo test test-newest test-oldest test-without-compiled test-trainers lint bench clean

demo: .venv/.installed
	.venv/bin/mmrope demo

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
	.venv/bin/ruff check mmrope_core mmrope_plugins examples tests/trainers tests/padding_free tests/test_collators.py
	.venv/bin/mypy

bench: .venv/.installed
	.venv/bin/python benchmarks/qwen_vl.py
	.venv/bin/python benchmarks/qwen_omni.py
	.venv/bin/python benchmarks/packing.py
	.venv/bin/python benchmarks/transformers_families.py
	.venv/bin/python benchmarks/padding_free.py

.venv/.installed: requirements/newest.txt $(SOURCES)
	$(PYTHON) -m venv .venv
	.venv/bin/pip install -q -r requirements/newest.txt
	.venv/bin/pip install -q --no-build-isolation $(EDITABLE)
	touch $@

.venv-oldest/.installed: requirements/oldest.txt $(SOURCES)
	$(PYTHON) -m venv .venv-oldest
	.venv-oldest/bin/pip install -q -r requirements/oldest.txt
	.venv-oldest/bin/pip install -q --no-build-isolation $(EDITABLE)
	touch $@

TRAINER_REQUIREMENTS := $(addprefix requirements/,trainers.txt verl.txt llamafactory.txt swift.txt)
.venv-trainers/.installed: $(TRAINER_REQUIREMENTS) $(SOURCES)
	$(PYTHON) -m venv .venv-trainers
	.venv-trainers/bin/pip install -q -r requirements/trainers.txt
	.venv-trainers/bin/pip install -q --no-deps -r requirements/verl.txt -r requirements/llamafactory.txt \
		-r requirements/swift.txt
	.venv-trainers/bin/pip install -q --no-build-isolation $(EDITABLE)
	touch $@

clean:
	rm -rf .venv .venv-oldest .venv-trainers
