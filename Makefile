# The README's two commands: `make demo` and `make test`. Both install what is missing first.
BUILD_DIR ?= build
JOBS ?= 2
CMAKE_FLAGS ?=
ifeq ($(CI),true)
CMAKE_FLAGS += -DFLARE_WERROR=ON
endif
PYTHON ?= python3

.PHONY: all deps configure build quiet-build test unit-test py-test fuzz-test demo bench format clean wheel

all: build

deps:
	@bash deploy/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS) >/dev/null

build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)

# The same, its output in $(BUILD_DIR)/build.log unless it fails (make demo, make wheel).
quiet-build:
	@bash tools/quiet-build.sh $(BUILD_DIR) $(JOBS) $(CMAKE_FLAGS)

unit-test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) --timeout 300

py-test: build
	FLARE_BUILD_DIR=$(abspath $(BUILD_DIR)) $(PYTHON) -m pytest -q tests/python

# The libFuzzer targets (ingest, HTTP request head, spool readers) built with clang in
# $(BUILD_DIR)-fuzz, each run on its seed corpus for 8 s (tools/fuzz/run.sh, tests/fuzz/).
fuzz-test: deps
	FLARE_FUZZ_BUILD_DIR=$(abspath $(BUILD_DIR))-fuzz JOBS=$(JOBS) bash tools/fuzz/run.sh 8

test: unit-test py-test fuzz-test

# The pip-installable wheel: the package with the hook, flared and the tools, dependencies
# vendored (tools/packaging/make-wheel.sh; docs/install.md). Written to $(BUILD_DIR)/wheel/dist.
wheel: quiet-build
	@bash tools/packaging/make-wheel.sh $(BUILD_DIR)

demo: quiet-build
	@bash tools/demo.sh $(BUILD_DIR)

# The evaluation (overhead, hot path, volume; more sections as parts land): tools/bench/run.py.
bench: build
	$(PYTHON) tools/bench/run.py --build $(BUILD_DIR)

format:
	@git ls-files '*.cc' '*.h' | xargs clang-format -i

clean:
	rm -rf $(BUILD_DIR)
