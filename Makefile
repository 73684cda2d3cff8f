# All set-up happens here: a fresh machine needs only python3 (>= 3.11) and make.
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of PyTorch; a GPU machine can set TORCH_SPEC to its own build.
TORCH_SPEC ?= torch==2.13.0

.PHONY: install constraints demo test test-fast benchmark benchmark-litgpt gpu-check slurm-packages

$(VENV)/.installed: pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet --constraint constraints.txt -e ".[dev,notebooks,eval]"
	$(PY) -m ipykernel install --sys-prefix --name blindheads --display-name "Python (blindheads)"
	if git rev-parse --git-dir >/dev/null 2>&1; then $(VENV)/bin/nbstripout --install; fi
	touch $@

install: $(VENV)/.installed

# constraints.txt: every package version the suite last passed with, so a fresh install is the tested one. Left out:
# torch and what only torch needs (sympy, CUDA libraries, ...), which TORCH_SPEC picks for the machine. After upgrading
# packages and passing `make test`, `make constraints` records them.
define FREEZE
import importlib.metadata as metadata, re, subprocess, sys
def name(requirement): return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9_.-]+", requirement)[0]).lower()
installed = {name(d.metadata["Name"]): d for d in metadata.distributions()}
def needed(roots, skip=()):
    seen, todo = set(), list(roots)
    while todo:
        package = todo.pop()
        if package in installed and package not in seen and package not in skip:
            seen.add(package)
            todo += [name(r) for r in installed[package].requires or [] if "extra ==" not in r]
    return seen
ours = {name(r) for r in installed["blindheads"].requires}  # with every extra: make install takes them all
torch_only = needed(["torch"]) - needed(ours, skip={"torch"})
frozen = subprocess.run([sys.executable, "-m", "pip", "freeze", "--exclude-editable"], capture_output=True, text=True,
                        check=True).stdout.splitlines()
print("# written by make constraints: the versions make test passed with (torch and what only it needs aside)")
print(*(line for line in frozen if name(line) not in torch_only), sep="\n")
endef
export FREEZE
constraints: install
	$(PY) -c "$$FREEZE" > constraints.txt.new
	mv constraints.txt.new constraints.txt
	touch $(VENV)/.installed

# The README's main job: a real, short fit on the offline builtin data (default ALiBi learning retrieval on the dense
# mix), then test: recall by distance inside and beyond the window, blind or reachable, beside each head's blindness.
DEMO := --config configs/experiments/laptop.yaml --config configs/experiments/dense_recall.yaml --config configs/demo.yaml
demo: install
	rm -rf runs/demo
	$(VENV)/bin/blindheads fit $(DEMO)
	$(VENV)/bin/blindheads test $(DEMO) --ckpt_path last --verbose false
	@echo "checkpoint: runs/demo/alibi/checkpoints/last.ckpt; more commands: . $(VENV)/bin/activate, then blindheads --help"

# The README's test command: lint and format checks, the type check, then the whole suite, slow tests included (CI
# runs this).
test: install slurm-packages
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(PY) -m pytest -n 2 --durations=15

# CI (CI=true, root, Debian 12): the packages of the single-node SLURM that tests/test_local_slurm.py starts
# (slurm/local-cluster.sh, which also installs them itself where they are missing and it runs as root; where SLURM
# cannot start, that test is skipped, saying why).
slurm-packages:
	if [ "$(CI)" = true ] && ! command -v slurmctld >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm slurmdbd munge mariadb-server \
		|| echo "make: the SLURM packages did not install: tests/test_local_slurm.py will be skipped, saying why"; fi

# The everyday suite: skips tests marked slow.
test-fast: install
	$(PY) -m pytest -n 2 -m "not slow"

# Scripts that print figures (a few minutes each on 2 cores).
benchmark: install
	$(PY) benchmarks/decoder_throughput.py
	$(PY) benchmarks/attention_blocks.py
	$(PY) benchmarks/data_throughput.py
	$(PY) benchmarks/training_throughput.py
	$(PY) benchmarks/long_scoring.py --length 16384 --layers 6

# Training tokens/s of ours against litgpt's GPT of the same shape (benchmarks/litgpt_throughput.py; about 2.5 min on
# 2 cores). litgpt's pins do not resolve with ours: its wheel goes in without its dependencies (litgpt.model needs only
# torch) into .bench/litgpt (git-ignored), which only that script puts on sys.path. The version is the script's.
LITGPT_VERSION = $(shell sed -n 's/^LITGPT_VERSION = "\([^"]*\)".*/\1/p' benchmarks/litgpt_throughput.py)
benchmark-litgpt: install
	test -d .bench/litgpt/litgpt-$(LITGPT_VERSION).dist-info || { rm -rf .bench/litgpt && \
		$(PY) -m pip install --quiet --no-deps --target .bench/litgpt litgpt==$(LITGPT_VERSION); }
	$(PY) benchmarks/litgpt_throughput.py

# On a CUDA machine (after `make install TORCH_SPEC=torch`): backends, compiled bf16 training, zero thresholds,
# the 7B probe's memory; about 5 minutes, prints a table and writes gpu_check.json.
gpu-check: install
	$(PY) benchmarks/gpu_check.py --out gpu_check.json
