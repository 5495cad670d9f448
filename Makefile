# SPDX-License-Identifier: MIT
# A thin wrapper around CMake.  `make demo` and `make check` are the two
# commands a newcomer needs (see README.md).
BUILD ?= build
ASAN_BUILD ?= build-asan
PREFIX ?= /usr/local
JOBS ?= $(shell nproc)
CTEST_ARGS ?=
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_ARGS ?=

.PHONY: all deps configure demo check check-asan bench install clean fuzz

all: configure
	cmake --build $(BUILD) -j$(JOBS)

deps:
	@scripts/deps.sh build

configure: deps
	@test -f $(BUILD)/CMakeCache.txt || cmake -S . -B $(BUILD) -DCMAKE_INSTALL_PREFIX=$(PREFIX)

demo: all
	$(BUILD)/bin/urdma_demo
	@echo "== the urdma API: an asynchronous echo server and a client"
	@$(BUILD)/bin/urdma_echo_server 127.0.0.1:7471 & srv=$$!; sleep 0.5; \
	 $(BUILD)/bin/urdma_echo_client 127.0.0.1:7471 "hello over urdma"; rc=$$?; \
	 kill $$srv; wait $$srv 2>/dev/null; exit $$rc

check: all
	@scripts/deps.sh check
	cd $(BUILD) && ctest --output-on-failure --timeout 600 $(CTEST_ARGS)

# Not under ASan: the tests that run Debian's client binaries on urdma (compat_,
# security_, the net_ ones that do (all but net_conformance_tcp, net_faults,
# net_api), rdmacm_clients, rdmacm_rstream and rdmacm_setup_syscalls),
# abi_, scale_ (tens of thousands of QPs, sized for the plain build), and
# api_install (it links a program without ASan against the installed,
# instrumented libraries). Their hostile-input halves run under ASan in
# conf_hostile_shm.
check-asan: deps
	@scripts/deps.sh check
	@test -f $(ASAN_BUILD)/CMakeCache.txt || cmake -S . -B $(ASAN_BUILD) -DURDMA_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug
	cmake --build $(ASAN_BUILD) -j$(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=0 ctest --output-on-failure --timeout 600 -E '^(compat|abi|security|scale)_|^net_(rc_pingpong|perftest|wire_check|rdmacm|qp_types|middleware)$$|^rdmacm_(clients|rstream|setup_syscalls)$$|^api_install$$' $(CTEST_ARGS)

bench: all
	@scripts/deps.sh bench
	bench/bench.sh $(BUILD)

# libFuzzer on the iWARP parser, on what is read from shared memory, on
# the TCP transport's placement (a real QP fed hostile messages) and on UD
# datagrams from the network (a real UD QP fed hostile datagrams), for
# FUZZ_SECONDS each (clang and its compiler-rt, which scripts/deps.sh fuzz
# installs).  New inputs go to $(FUZZ_BUILD)/corpus*, crashes to
# $(FUZZ_BUILD)/crash-*; the parser's seeds are tests/fuzz/corpus.
# `make check` runs both without libFuzzer (fuzz_*_replay).
FUZZ_SRC = tests/fuzz/fuzz_iwarp_parse.c src/transport/tcp/iwarp_parse.c src/transport/tcp/crc32c.c
FUZZ_CORE = $(wildcard src/core/*.c src/transport/*.c src/transport/*/*.c src/util/*.c src/verbs/*.c)
FUZZ_FLAGS = -g -O1 -fno-omit-frame-pointer -D_GNU_SOURCE -Isrc -Itests/common \
	-fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
fuzz: deps
	@scripts/deps.sh fuzz
	@mkdir -p $(FUZZ_BUILD)/corpus $(FUZZ_BUILD)/corpus-shm $(FUZZ_BUILD)/corpus-tcp $(FUZZ_BUILD)/corpus-ud
	clang $(FUZZ_FLAGS) $(FUZZ_SRC) -o $(FUZZ_BUILD)/fuzz_iwarp_parse
	clang $(FUZZ_FLAGS) tests/fuzz/fuzz_shm.c $(FUZZ_CORE) -lpthread -o $(FUZZ_BUILD)/fuzz_shm
	clang $(FUZZ_FLAGS) tests/fuzz/fuzz_tcp_place.c $(FUZZ_CORE) -lpthread -o $(FUZZ_BUILD)/fuzz_tcp_place
	clang $(FUZZ_FLAGS) tests/fuzz/fuzz_ud.c $(FUZZ_CORE) -lpthread -o $(FUZZ_BUILD)/fuzz_ud
	cd $(FUZZ_BUILD) && ./fuzz_iwarp_parse -max_total_time=$(FUZZ_SECONDS) \
		-print_final_stats=1 $(FUZZ_ARGS) corpus $(CURDIR)/tests/fuzz/corpus
	cd $(FUZZ_BUILD) && URDMA_LOG_FILE=/dev/null ./fuzz_shm \
		-max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 $(FUZZ_ARGS) corpus-shm
	cd $(FUZZ_BUILD) && ./fuzz_tcp_place -max_total_time=$(FUZZ_SECONDS) \
		-print_final_stats=1 $(FUZZ_ARGS) corpus-tcp
	cd $(FUZZ_BUILD) && ./fuzz_ud -max_total_time=$(FUZZ_SECONDS) \
		-print_final_stats=1 $(FUZZ_ARGS) corpus-ud

install: all
	cmake --install $(BUILD) --prefix $(PREFIX)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD)
