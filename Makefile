# Two commands on a fresh machine:
#   make serve   set up .venv and run `gputally serve` on the embedded default config
#   make test    set up .venv, install what the tests need, and run the whole suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# Go builds the test-only binaries (kube-apiserver, etcd); the machines carry it in /usr/local/go.
export PATH := /usr/local/go/bin:$(PATH)

.PHONY: serve test typecheck importcheck venv harness go-test bench clean docs demo

# Two stamps: `make serve` installs gputally and its runtime dependencies only; the test
# extras (pytest, hypothesis, ruff) come with the first `make test`.
# setuptools says "Editable installation ... folders with the same name as your package" on
# every editable install of this layout (package-dir maps receiver/, probes/... into gputally):
# information only, and the layout is deliberate, so that one warning is filtered by its text.
export PYTHONWARNINGS := ignore:Editable installation
$(VENV)/.serve-installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip setuptools wheel
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.test-installed: $(VENV)/.serve-installed
	$(BIN)/pip install -q -e '.[test]'
	touch $@

venv: $(VENV)/.test-installed

serve: $(VENV)/.serve-installed
	$(BIN)/gputally serve

# The real servers and tools the tests use, each built or installed by its own script into a
# cache outside the tree (a current build returns at once). On a fresh machine they run three
# at a time: vLLM's 3 GB download and the apt installs mostly wait on the network while the Go
# and C++ compiles keep both CPUs busy. Each build's output is printed whole when it ends.
HARNESS := vllm apt kube otelcol llamacpp prometheus helm h2spec gotools tinyllama
.PHONY: $(addprefix harness-,$(HARNESS))
harness:
	+$(MAKE) --no-print-directory -j3 --output-sync=target $(addprefix harness-,$(HARNESS))

harness-vllm:
	tests/harness/engines/vllm/build.sh
harness-llamacpp:
	tests/harness/engines/llamacpp/build.sh
# The tiny Llama is made with vLLM's venv and converted with llama.cpp's converter.
harness-tinyllama: harness-vllm harness-llamacpp
	tests/harness/engines/tinyllama/build.sh
harness-kube:
	tests/harness/kube/build.sh
harness-otelcol:
	tests/harness/otelcol/build.sh
harness-prometheus:
	tests/harness/prometheus/build.sh
harness-helm:
	tests/harness/helm/build.sh
harness-h2spec:
	tests/harness/h2spec/build.sh
# go-test's mdatagen and staticcheck.
harness-gotools:
	tests/harness/mdatagen/build.sh
	tests/harness/staticcheck/build.sh
# One after another: each may run apt-get, which holds dpkg's lock.
harness-apt:
	sh tests/harness/slurm/setup.sh
	sh tests/harness/image/setup.sh
	sh tests/harness/systemd/setup.sh

test: venv harness go-test
	$(BIN)/ruff check --no-cache .
	$(BIN)/python .ci/importcheck.py
	$(BIN)/python .ci/typecheck.py
	$(MAKE) docs
	$(BIN)/python -m pytest

# The Collector-side bridge processor (its own Go module): its mdatagen output current, vet,
# unit tests (the generated lifecycle tests too) under the race detector, and staticcheck
# (mdatagen and staticcheck built once into ~/.cache/gputally by their harness scripts), with
# the Go in /usr/local/go only (no toolchain download); the first run fetches modules from the proxy.
go-test:
	mdatagen=$$(tests/harness/mdatagen/build.sh) && tests/harness/mdatagen/check.sh $${mdatagen#MDATAGEN=}
	cd collector/gputallyprocessor && GOTOOLCHAIN=local go vet ./... && GOTOOLCHAIN=local go test -race ./...
	staticcheck=$$(tests/harness/staticcheck/build.sh) && cd collector/gputallyprocessor && \
		GOTOOLCHAIN=local $${staticcheck#STATICCHECK=} ./...

# mypy on the package as installed (gputally.*); see .ci/typecheck.py for why not on the tree.
typecheck: venv
	$(BIN)/python .ci/typecheck.py

# The three layers (pyproject's [tool.importlinter]): no component imports another.
importcheck: venv
	$(BIN)/python .ci/importcheck.py

# The documentation site (mkdocs.yml, docs/): strict, so a broken link or a missing page fails.
# Not -q: quiet hides the warnings, and strict mode then has none to fail on.
docs: venv
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -d build/site

# No cluster needed: the recorded H200 replayed through a real `serve` with `usage`.
demo: $(VENV)/.serve-installed
	$(BIN)/gputally demo

bench: venv
	$(BIN)/python bench/pipeline_throughput.py

clean:
	rm -rf $(VENV) build *.egg-info
