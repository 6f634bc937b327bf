# The two commands of the README. Both work on a fresh machine with only Python >= 3.10.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.minidist-installed

.PHONY: tour test test-all test-gpu test-unit test-triton-latest test-notebooks lint format exercises notebooks bench clean site test-site

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# torch first: with no torch present, pin the CPU-friendly 2.13.0 so that an unpinned
# install does not pull a multi-GB CUDA build. On a CPU torch use triton 3.8.0 (3.9.0's
# interpreter rejects masks that mix vector and scalar conditions); a CUDA torch keeps
# the triton it pins.
$(STAMP): $(PY) pyproject.toml
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet "torch==2.13.0"
	$(PY) -c "import torch, sys; sys.exit(0 if torch.version.cuda else 1)" 2>/dev/null \
	  || [ "$$(uname -s)" != "Linux" ] || $(PY) -m pip install --quiet "triton==3.8.0"
	$(PY) -m pip install --quiet -e ".[dev]"
	# ipykernel stages the spec in a mkdtemp it never removes: give it a folder of its own
	d=$$(mktemp -d) && TMPDIR=$$d $(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null \
	  && rm -rf "$$d"
	touch $(STAMP)

tour: $(STAMP)
	$(PY) -m minidist tour

test: $(STAMP) lint test-triton-latest test-all

# The checks that need a GPU (compiled Triton kernels, NCCL worlds), name=value lines; on a
# machine without one it says so and exits 0. Not part of `make test` (CI has no GPU).
test-gpu: $(STAMP)
	env -u TRITON_INTERPRET $(PY) -m minidist gpucheck

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# Three pytest workers (pytest-xdist), one test file or notebook at a time each: one process
# alone keeps two cores about 1.4 busy (worlds wait in gloo, graders on their kernels and
# timeouts, a notebook's kernel uses about 1.2); two kept them 173% busy, three 191% (on 2
# cores: 1,002 s against 1,077 s for the same tests). tests/conftest.py orders the files,
# slowest first, then the notebooks alternating with the other files. JOBS=1 for one
# worker. `test-all` (what `make test` runs) is `test-unit` and `test-notebooks` in one
# session, so that neither waits for the other's idle core.
JOBS ?= 3

test-all: $(STAMP)
	TRITON_INTERPRET=1 $(PY) -m pytest -q -n $(JOBS) --dist loadfile --nbval-lax --nbval-current-env tests notebooks solutions

test-unit: $(STAMP)
	TRITON_INTERPRET=1 $(PY) -m pytest -p no:nbval -q -n $(JOBS) --dist loadfile tests

# The Triton kernels also under the newest triton's interpreter (3.9, what `pip install` of
# the package brings on a CPU machine), installed beside the venv's 3.8, not over it.
TRITON_LATEST := .triton-latest
$(TRITON_LATEST)/.installed: $(STAMP)
	[ "$$(uname -s)" != "Linux" ] || $(PY) -m pip install --quiet --no-deps --target $(TRITON_LATEST) "triton==3.9.0"
	touch $@

test-triton-latest: $(TRITON_LATEST)/.installed
	[ "$$(uname -s)" != "Linux" ] || PYTHONPATH=$(TRITON_LATEST) TRITON_INTERPRET=1 $(PY) -m pytest -p no:nbval -q tests/test_embedding_hash.py tests/test_embedding_layers.py tests/test_embedding_backward.py

test-notebooks: $(STAMP)
	TRITON_INTERPRET=1 $(PY) -m pytest -q --nbval-lax --nbval-current-env notebooks solutions

format: $(STAMP)
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

exercises: $(STAMP)
	$(PY) -m minidist exercises

# Re-execute every lesson and solution in place (outputs are kept in git), then regenerate
# exercises/ from the solutions.
notebooks: $(STAMP)
	for nb in notebooks/*.ipynb solutions/*.ipynb; do \
	  TRITON_INTERPRET=1 $(PY) -m jupyter nbconvert --to notebook --execute --inplace "$$nb" || exit 1; \
	done
	$(PY) -m minidist exercises

# The course website, from the notebooks' committed outputs (nothing re-executed), into
# build/site/ (ignored); offline: nbconvert's own template, MathJax copied in. Its browser
# test (tests/test_site.py, part of test-unit) needs Chromium: apt-get install -y chromium.
site: $(STAMP)
	$(PY) -m minidist site --out build/site

test-site: $(STAMP)
	$(PY) -m pytest -p no:nbval -q tests/test_site.py

bench: $(STAMP)
	$(PY) -m minidist bench ddp

clean:
	rm -rf $(VENV) $(TRITON_LATEST) minidist_tour .pytest_cache build/site build/site-screenshots
