# make run   -> set up .venv if missing, then train the default experiment (digits, 2 ranks)
# make test  -> set up .venv if missing, then lint (ruff) and run the test suite
# make test-fast -> the tests not marked slow (the quick loop)
# make coverage -> the suite under coverage.py, ranks and subprocesses included: line and branch coverage per
#                 room of gvq/ (.coverage-data/rooms.md; COVERAGE_BEFORE=old.json adds a before column)
# make layout-report -> the modules over ~300 lines, largest first (a report to read, not a failure)
# make setup -> only the install;  make bench -> the aggregation benchmark
# make validate-clock -> virtual time against wall-clock (V1-V3, a few minutes)
# make paper-time -> the GradiVeQ paper's time table in virtual time (N = 6, 8, 16; a long run, resumable)
# make projection -> calibrate the cost model per model, then which aggregator (and mode: post-backward or
#                   overlapped) wins at N x B (heatmaps)
# make frontier -> each family across its settings on Fashion-MNIST (experiment=fmnist_tta), then the
#                  report's accuracy-cost frontier; SEEDS=0 WORLD=4 for a screen (about 40 minutes on
#                  2 cores), the defaults (3 seeds, N = 4 and 8) for the table (hours)
# make lm-frontier -> the same families across their settings on the small GPT on Austen's novels
#                  (experiment=lm_tta), then the report's bits-per-byte-cost frontier at LM_TARGET (a validation
#                  loss); SEEDS=0 WORLD=4 for a screen, the defaults for the table
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.gvq-installed

.PHONY: setup data run test test-fast coverage layout-report bench validate-clock paper-time projection frontier lm-frontier clean

# the exact versions this machine installs (torch's CPU build); pyproject.toml states only the ranges gvq needs
CONSTRAINTS ?= constraints-cpu.txt

$(STAMP): pyproject.toml setup.py $(CONSTRAINTS)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c $(CONSTRAINTS) torch
	$(PY) -m pip install -q -c $(CONSTRAINTS) -e '.[test,slurm,joblib,lightning,accelerate]'
	touch $(STAMP)

setup: $(STAMP) data

# Fashion-MNIST (dataset=fashion_mnist) and Austen's novels (dataset=austen) from Debian's packages where we may
# (root with apt-get); elsewhere one
# line says how, and set-up goes on (gvq never downloads data at run time)
FASHION := /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz
# Austen's novels (dataset=austen): only the R library folder of Debian's r-cran-janeaustenr, unpacked from the
# .deb alone (installing the package pulls R, some 700 packages)
AUSTEN := /usr/lib/R/site-library/janeaustenr/data
data:
	@test -f $(FASHION) || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	    { apt-get install -y -qq dataset-fashion-mnist >/dev/null 2>&1 || \
	      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist >/dev/null; }; } ; } \
	  || echo "note: Fashion-MNIST not installed; for dataset=fashion_mnist run 'apt-get install dataset-fashion-mnist' as root, or set GVQ_DATA to a folder with its four IDX files"
	@test -f $(AUSTEN)/Rdata.rdb || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && tmp=$$(mktemp -d) && \
	    ( cd $$tmp && { apt-get download -qq r-cran-janeaustenr >/dev/null 2>&1 || \
	      { apt-get update -qq && apt-get download -qq r-cran-janeaustenr >/dev/null 2>&1; }; } && \
	      dpkg-deb --fsys-tarfile r-cran-janeaustenr_*.deb | tar -x -C / ./usr/lib/R/site-library/janeaustenr ) ; \
	    status=$$?; rm -rf $$tmp; exit $$status; } \
	  || echo "note: Austen's novels not installed; for dataset=austen, as root: apt-get download r-cran-janeaustenr, then dpkg-deb -x the .deb into a folder and set GVQ_DATA to it (installing the package pulls R)"

run: $(STAMP) data
	$(PY) cli.py

# --durations=25: the slowest tests, so the next slow one is seen the day it lands.  -n 2 --dist loadfile: two
# pytest-xdist workers, a test file each at a time (its module fixtures computed once): much of the suite waits
# (rank rendezvous, interpreters starting, signals) or runs one thread, so two files fill two cores better than
# one; a fixed 2, not the host's core count, so the suite runs the same on every machine
XDIST := -n 2 --dist loadfile
# ruff first (pyproject.toml's [tool.ruff]: the rules the code keeps): a finding stops the suite before it starts
LINT := $(PY) -m ruff check --no-cache --quiet .
test: $(STAMP) data
	$(LINT)
	WANDB_MODE=disabled $(PY) -m pytest -q -ra --durations=25 $(XDIST)

test-fast: $(STAMP) data
	$(LINT)
	WANDB_MODE=disabled $(PY) -m pytest -q -ra -m "not slow" $(XDIST)

# coverage.py follows every process the suite starts (pyproject.toml's [tool.coverage.run]: spawned or forked
# ranks, `python cli.py`); the data lives under .coverage-data/, never in the repository root that tests watch
COVDIR := $(CURDIR)/.coverage-data
COVERAGE_BEFORE ?=
coverage: $(STAMP) data
	rm -rf $(COVDIR) && mkdir -p $(COVDIR)
	export COVERAGE_FILE=$(COVDIR)/cov COVERAGE_PROCESS_START=$(CURDIR)/pyproject.toml WANDB_MODE=disabled; \
	  $(PY) -m coverage run -m pytest -q -ra -p no:randomly -p no:xdist; status=$$?; \
	  $(PY) -m coverage combine -q && $(PY) -m coverage json -q -o $(COVDIR)/coverage.json && \
	  $(PY) -m tests.helpers.coverage_rooms $(COVDIR)/coverage.json $(COVERAGE_BEFORE) | tee $(COVDIR)/rooms.md; \
	  exit $$status

layout-report: $(STAMP)
	$(PY) -m tests.test_layout

bench: $(STAMP)
	$(PY) -m gvq.bench aggregate       # its grid: conf/grid/bench.yaml

validate-clock: $(STAMP)
	$(PY) -m gvq.bench clock       # its grid: conf/grid/clock.yaml

paper-time: $(STAMP)
	$(PY) -m gvq.bench paper grid.world_sizes=[6] links=[auto,1e9]
	$(PY) -m gvq.bench paper grid.world_sizes=[8,16] links=[auto]
	$(PY) -m gvq.report cycle runs/paper_time/N* --out runs/paper_time/report

COMMA := ,
MODELS ?= cnn,resnet20,resnet32,resnet110
projection: $(STAMP)
	for m in $(subst $(COMMA), ,$(MODELS)); do test -f runs/predict/$$m/calibration.json || \
	    $(PY) -m gvq.predict calibrate model=$$m num_classes=$$( [ $$m = cnn ] && echo 10 || echo 100 ) || exit 1; \
	    test -f runs/predict/$$m/overlap.json || $(PY) -m gvq.predict calibrate-overlap model=$$m || exit 1; done
	$(PY) -m gvq.predict project models=[$(MODELS)]
	$(PY) -m gvq.predict project overlap=true models=[$(MODELS)]

SEEDS ?= 0,1,2
WORLD ?= 4,8
FRONTIER := runs/multirun/fmnist_frontier
EF := gvq.aggregators.error_feedback.ErrorFeedbackAggregator
frontier: $(STAMP) data
	$(PY) cli.py -m experiment=fmnist_tta hydra.sweep.dir=$(FRONTIER)/base aggregator=rar,fp16 world_size=$(WORLD) seed=$(SEEDS)
	$(PY) cli.py -m experiment=fmnist_tta hydra.sweep.dir=$(FRONTIER)/qsgd aggregator=qsgd aggregator.compressor.bits=2,3,4,8 world_size=$(WORLD) seed=$(SEEDS)
	$(PY) cli.py -m experiment=fmnist_tta hydra.sweep.dir=$(FRONTIER)/powersgd aggregator=powersgd aggregator.rank=1,2,4,8 world_size=$(WORLD) seed=$(SEEDS)
	$(PY) cli.py -m experiment=fmnist_tta hydra.sweep.dir=$(FRONTIER)/gradiveq aggregator=gradiveq_pooled aggregator.compressor.target_ratio=8,16 world_size=$(WORLD) seed=$(SEEDS)
	$(PY) cli.py -m experiment=fmnist_tta hydra.sweep.dir=$(FRONTIER)/gradiveq_cap aggregator=gradiveq world_size=$(WORLD) seed=$(SEEDS)
	$(PY) cli.py -m experiment=fmnist_tta hydra.sweep.dir=$(FRONTIER)/two_level aggregator=signsgd,bingrad_b aggregator._target_=gvq.aggregators.compressed.CompressedAggregator,$(EF) world_size=$(WORLD) seed=$(SEEDS)
	$(PY) -m gvq.report frontier $(FRONTIER) target_acc=0.8

LM_FRONTIER := runs/multirun/lm_frontier
# the validation loss (nats per token) iterations are counted to: one rar reaches well inside lm_tta's budget
# (docs/results.md, "A transformer LM on Austen's novels": rar is below it by its 300-step screen's end), so a
# setting that misses it misses it for its compression, not the budget; lower => a harder target, fewer reach it
LM_TARGET ?= 2.4
lm-frontier: $(STAMP) data
	$(PY) cli.py -m experiment=lm_tta hydra.sweep.dir=$(LM_FRONTIER)/base aggregator=rar,fp16 world_size=$(WORLD) seed=$(SEEDS)
	$(PY) cli.py -m experiment=lm_tta hydra.sweep.dir=$(LM_FRONTIER)/qsgd aggregator=qsgd aggregator.compressor.bits=2,4,8 world_size=$(WORLD) seed=$(SEEDS)
	$(PY) cli.py -m experiment=lm_tta hydra.sweep.dir=$(LM_FRONTIER)/powersgd aggregator=powersgd aggregator.rank=1,2,4,8,16 world_size=$(WORLD) seed=$(SEEDS)
	$(PY) cli.py -m experiment=lm_tta hydra.sweep.dir=$(LM_FRONTIER)/gradiveq aggregator=gradiveq world_size=$(WORLD) seed=$(SEEDS)
	$(PY) cli.py -m experiment=lm_tta hydra.sweep.dir=$(LM_FRONTIER)/two_level aggregator=signsgd,bingrad_b aggregator._target_=gvq.aggregators.compressed.CompressedAggregator,$(EF) world_size=$(WORLD) seed=$(SEEDS)
	$(PY) -m gvq.report frontier $(LM_FRONTIER) target_loss=$(LM_TARGET)

# make gpu-check -> on a CUDA machine: every CUDA test, gvq.bench codecs on the GPU, cli.py device=cuda for every
# aggregator at world_size 1 and 3; one table (runs/gpucheck/gpucheck.md).  No venv needed (python3 with torch
# and hydra on PYTHONPATH); with the venv: make gpu-check PYTHON=.venv/bin/python.  Parts: GPU_CHECK_ARGS="part=[cli]"
.PHONY: gpu-check
gpu-check:
	WANDB_MODE=disabled $(PYTHON) -m gvq.bench gpucheck $(GPU_CHECK_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
