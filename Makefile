# The contract: `make train` and `make test` work on a fresh clone; each sets up .venv itself.
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip install -q --disable-pip-version-check
STAMP  := $(VENV)/.installed
# A plain `torch` would pull a multi-GB CUDA build; the pinned CPU wheel is what runs here and in CI.
TORCH  := torch==2.13.0

.PHONY: install train test test-fast typecheck learning bench gpu-check lint clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) --upgrade pip
	$(PIP) $(TORCH)
	$(PIP) -e '.[atari,video,sweep,report,mujoco,slurm,ray,envs,wandb,mlflow,dev]'
	# The tests' MLflow tracking server (`mlflow server`, as a team runs it) needs SQLAlchemy 2, which the sweep
	# extra's optuna < 3 keeps out of the venv: the server alone gets it from this folder (on its PYTHONPATH).
	$(PIP) --upgrade --target $(VENV)/mlflow-server 'sqlalchemy>=2,<3'
	touch $(STAMP)

install: $(STAMP)

train: $(STAMP)
	$(VENV)/bin/rlrun train

# The type checker first (pyproject's [tool.mypy]): seconds once .mypy_cache holds the unchanged modules.
typecheck: $(STAMP)
	$(VENV)/bin/mypy

# Most tests are CLI runs, each mostly one busy process: one pytest worker per core (a test file stays on one
# worker, with its module fixtures). Tests whose outcome rests on timing or that start clusters then run alone.
test: typecheck
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n auto --dist loadfile -m "not serial" --durations=15
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -m serial --durations=10

test-fast: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n auto --dist loadfile -m "not slow and not dist"

# The long learning checks (runs to a learned result, repeated-run stress): bench/learning/, not part of `make test`.
learning: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q bench/learning

bench: $(STAMP)
	$(PIP) -e '.[atari,video,sweep,report,mujoco,slurm,ray,envs,dev,bench]'
	OMP_NUM_THREADS=1 $(PY) bench/peers.py

# On a machine with CUDA: a short GPU run of each algorithm, 1 and 2 ranks, with an exact-resume check.
gpu-check: $(STAMP)
	$(PY) bench/gpu_check.py

lint: typecheck
	$(VENV)/bin/ruff check rlrun tests bench hydra_plugins
	$(VENV)/bin/ruff format --check rlrun tests bench hydra_plugins

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache
