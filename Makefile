# The two commands: `make demo` (the main job) and `make test`.
# Each creates/updates the virtual environment in $(VENV) first.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU wheel of torch that lies on this machine's disk; any other torch request may
# pull a multi-GB CUDA build. The package itself only asks for a range (setup.cfg).
TORCH_PIN ?= torch==2.13.0
PYTEST_ARGS ?=
export TOKENIZERS_PARALLELISM = false

.PHONY: demo demo-2proc demo-2proc-fsdp test test-all install clean

$(VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_PIN)"
	$(PY) -m pip install --quiet -e ".[test]"
	touch $@

# The sweep backends' extras (Ray, submitit) and the trackers (W&B, MLflow, Trackio, all
# tested offline): only the tests need them, so that their tests run in CI instead of being
# skipped; `make demo` sweeps with the local backend and writes TensorBoard events.
$(VENV)/.installed-extras: $(VENV)/.installed
	$(PY) -m pip install --quiet -e ".[test,ray,slurm,wandb,mlflow,trackio]"
	touch $@

install: $(VENV)/.installed

demo: $(VENV)/.installed
	$(PY) -m ppo.sft
	$(PY) -m ablations run quick --seeds 2 --threads 1 --out sweeps/quick

# Data parallel on the CPU: 2 processes (gloo), each sampling half of the global batch.
demo-2proc: $(VENV)/.installed
	$(PY) -m ppo.sft
	$(VENV)/bin/accelerate launch --config_file configs/accelerate/cpu-2proc.yaml -m ppo.cli \
		--preset grpo --testbed --device cpu --threads 1 --output-dir runs/grpo_2proc

# The same with sharded models (FSDP2): AlpacaFarm's preset, every model split over the 2 processes.
demo-2proc-fsdp: $(VENV)/.installed
	$(PY) -m ppo.sft
	$(VENV)/bin/accelerate launch --config_file configs/accelerate/cpu-2proc-fsdp.yaml -m ppo.cli \
		--preset alpacafarm --testbed --device cpu --threads 1 --output-dir runs/af_fsdp_2proc

test: $(VENV)/.installed-extras
	$(PY) -m pytest -q $(PYTEST_ARGS)

test-all: $(VENV)/.installed-extras
	$(PY) -m pytest -q -m "slow or not slow" $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .cache runs *.egg-info
