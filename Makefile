# The two commands a newcomer runs (as root on a fresh Debian 12 machine):
#   make demo   install, build the cohort binary, then train on real data
#   make test   install, build the binary and the tests, then run the whole suite
SHELL := /bin/bash
BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= 2

.PHONY: all deps configure build test demo clean

all: build

deps:
	bash scripts/install-deps.sh

configure: deps
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE)

build: configure
	cmake --build $(BUILD_DIR) -j$(JOBS)

# The suite builds what it runs: the cohort binary, the tests and the
# oracles' tool (not the benchmarks). ctest lists the tests that did not run
# (SKIPPED: no GPU here) after its summary; the summary line is repeated
# last, where CI and people look.
test: configure
	cmake --build $(BUILD_DIR) -j$(JOBS) --target cohort_tests cohort_oracle_tool
	cd $(BUILD_DIR) && { ctest --output-on-failure -j$(JOBS) 2>&1 | tee ctest.log; rc=$${PIPESTATUS[0]}; \
	  grep -E '^[0-9]+% tests passed' ctest.log | tail -1; exit $$rc; }

# The demo builds only what it runs: the cohort binary (no tests, no benchmarks).
demo: configure
	cmake --build $(BUILD_DIR) -j$(JOBS) --target cohort
	bash scripts/demo.sh $(BUILD_DIR)

clean:
	rm -rf $(BUILD_DIR)
