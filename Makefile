# tf_dlrm: `make demo` and `make test` are the two set-up commands (see README.md).
SHELL := /bin/bash
VENV ?= .venv
PYTHON := $(VENV)/bin/python
DEMO_DIR ?= data/demo
DEMO_RANKS ?= 2
# `make test` runs the suite in this many pytest-xdist workers (each test file is one unit; see tests/conftest.py).
TEST_WORKERS ?= 2
export TF_CPP_MIN_LOG_LEVEL ?= 2
# Bytecode is cached (git ignores __pycache__): with PYTHONDONTWRITEBYTECODE set, every pytest worker rewrites the
# asserts of every test file it collects, and every process a test starts compiles tf_dlrm again.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: install install-spark demo test test-unit bench clean

install:
	bash scripts/install.sh

install-spark:
	TF_DLRM_EXTRAS=test,spark bash scripts/install.sh

# Builds a synthetic dataset (once) of train, validation and test splits, trains DLRM on it with horovodrun, keeping
# the state of the best validation AUC (early stopping), and prints the test split's AUC, evaluated once at that state,
# next to the dataset's oracle AUC on the same split (the AUC of the hidden model that drew the labels). One pass over
# 2.4M fresh samples: a smaller set seen several times overfits after its first pass and ends short of the oracle.
# A dataset written before the test split existed (no oracle_test_auc) is written again.
demo: install
	@if ! grep -qs oracle_test_auc $(DEMO_DIR)/feature_spec.yaml; then \
	  $(PYTHON) -m tf_dlrm.data.synthetic --feature_spec=feature_specs/synthetic_small.yaml --output_dir=$(DEMO_DIR) \
	    --num_train_samples=2400000 --num_valid_samples=100000 --num_test_samples=100000 --seed=1; fi
	$(VENV)/bin/horovodrun -np $(DEMO_RANKS) -H localhost:$(DEMO_RANKS) --gloo $(PYTHON) main.py \
	  --dataset_path=$(DEMO_DIR) --embedding_dim=16 --bottom_mlp_dims=64,16 --top_mlp_dims=64,32,1 \
	  --batch_size=2048 --epochs=1 --evals_per_epoch=6 --early_stopping_patience=2 --print_freq=200 \
	  --log_path=$(DEMO_DIR)/demo_log.jsonl
	@$(PYTHON) scripts/print_auc.py $(DEMO_DIR)/demo_log.jsonl $(DEMO_DIR)/feature_spec.yaml

# The whole suite, Spark engine tests included (installs PySpark into the venv).
test: install-spark
	$(PYTHON) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=25 tests

# The everyday loop (docs/testing.md): tests that start no process (no horovodrun, main.py, python -m or Spark;
# tests/conftest.py marks the others `integration`), read no real Criteo sample and are not marked slow.
UNIT_TESTS ?= not integration and not slow and not real_data
test-unit: install
	$(PYTHON) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "$(UNIT_TESTS)" tests

bench: install
	$(PYTHON) benchmarks/run_all.py --output=benchmarks/results.json

clean:
	rm -rf data/demo .pytest_cache
