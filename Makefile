# SPDX-License-Identifier: MIT
# A thin wrapper around CMake.  `make demo` and `make check` are the two
# commands a newcomer needs (see README.md).
BUILD ?= build
ASAN_BUILD ?= build-asan
PREFIX ?= /usr/local
JOBS ?= $(shell nproc)
CTEST_ARGS ?=

.PHONY: all deps configure demo check check-asan bench install clean

all: configure
	cmake --build $(BUILD) -j$(JOBS)

deps:
	@scripts/deps.sh build

configure: deps
	@test -f $(BUILD)/CMakeCache.txt || cmake -S . -B $(BUILD) -DCMAKE_INSTALL_PREFIX=$(PREFIX)

demo: all
	$(BUILD)/bin/urdma_demo

check: all
	@scripts/deps.sh check
	cd $(BUILD) && ctest --output-on-failure --timeout 600 $(CTEST_ARGS)

# Not under ASan: the tests that run Debian's client binaries on urdma (compat_,
# and net_ but net_conformance_tcp), and abi_.
check-asan: deps
	@scripts/deps.sh check
	@test -f $(ASAN_BUILD)/CMakeCache.txt || cmake -S . -B $(ASAN_BUILD) -DURDMA_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug
	cmake --build $(ASAN_BUILD) -j$(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=0 ctest --output-on-failure --timeout 600 -E '^(compat|abi)_|^net_(rc_pingpong|perftest|wire_check)$$' $(CTEST_ARGS)

bench: all
	@scripts/deps.sh bench
	bench/bench.sh $(BUILD)

install: all
	cmake --install $(BUILD) --prefix $(PREFIX)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
