# make test: install what is missing, build Release and ASan+UBSan, run every test.
# make bench: build, create the default synthetic model if absent, run the main benchmark.
# make bench-targets: the decode targets (one sequence, 8 and 32) in alternating rounds (bench/targets.sh).
SHELL := /bin/bash
JOBS ?= $(shell nproc)
BUILD ?= build
ASAN_BUILD ?= build-asan
FUZZ_BUILD ?= build-fuzz
MODEL_DIR ?= models
BENCH_MODEL ?= $(MODEL_DIR)/qwen3-0.6b-q8_0.gguf
FUZZ_SECONDS ?= 15
# The sanitizer and fuzz builds keep line tables only (-g1): reports still
# name file and line, and the unrolled SIMD kernels compile ~40% faster than
# with full debug information.
SAN_FLAGS ?= -O2 -g1 -DNDEBUG

.PHONY: all deps build build-asan build-fuzz test test-release test-asan fuzz bench bench-targets clean format format-check

all: build

deps:
	@bash scripts/deps.sh

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

build-asan: deps
	@cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_C_FLAGS_RELWITHDEBINFO=$(SAN_FLAGS)" -DTK_SANITIZE=ON >/dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS)

build-fuzz: deps
	@CC=clang cmake -S . -B $(FUZZ_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_C_FLAGS_RELWITHDEBINFO=$(SAN_FLAGS)" -DTK_SANITIZE=ON -DTK_FUZZ=ON >/dev/null
	@cmake --build $(FUZZ_BUILD) -j $(JOBS) --target $$(cd tests/fuzz && ls fuzz_*.c 2>/dev/null | sed 's/\.c$$//' | tr '\n' ' ')

test-release: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# The sanitizer run skips the slow numeric reference tests (label 'slow'):
# they exercise the same code that the Release run already checks.
test-asan: build-asan
	@cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --output-on-failure -j $(JOBS) -LE slow

# Each libFuzzer target runs briefly from its seed corpus; a crash, leak or
# timeout fails the target (its log's tail is shown, the crash input is kept
# under $(FUZZ_BUILD)/crashes).
fuzz: build-fuzz
	@set -e; mkdir -p $(FUZZ_BUILD)/crashes $(FUZZ_BUILD)/tmp; for f in $(FUZZ_BUILD)/fuzz/fuzz_*; do \
	  name=$$(basename $$f); corpus=$(FUZZ_BUILD)/corpus/$$name; mkdir -p $$corpus; \
	  seeds=tests/fuzz/seeds/$$name; [ -d $$seeds ] || seeds=""; log=$(FUZZ_BUILD)/$$name.log; \
	  echo "fuzz: $$name for $(FUZZ_SECONDS)s"; \
	  if ! TMPDIR=$(FUZZ_BUILD)/tmp $$f -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=2048 -max_len=65536 -timeout=10 \
	      -artifact_prefix=$(FUZZ_BUILD)/crashes/$$name- $$corpus $$seeds >$$log 2>&1; then \
	    tail -n 40 $$log; echo "fuzz: $$name FAILED (log $$log)"; exit 1; \
	  fi; tail -n 3 $$log; \
	done

test: test-release test-asan fuzz

$(BENCH_MODEL): build
	@mkdir -p $(MODEL_DIR)
	@$(BUILD)/bin/tokamak synth --preset qwen3-0.6b --dtype q8_0 -o $@

bench: build $(BENCH_MODEL)
	@bash bench/run.sh $(BUILD)/bin/tokamak $(BENCH_MODEL)

# Makes the four synthetic qwen3-0.6b files it needs in MODEL_DIR; ROUNDS=N for more rounds.
ROUNDS ?= 3
bench-targets: build
	@bash bench/targets.sh $(BUILD)/bin/tokamak $(MODEL_DIR) $(ROUNDS)

format:
	@clang-format -i $$(git ls-files '*.c' '*.h')

# Every tracked C file as .clang-format formats it (CI runs this).
format-check: deps
	@bad=$$(for f in $$(git ls-files '*.c' '*.h'); do clang-format --dry-run -Werror "$$f" >/dev/null 2>&1 || echo "  $$f"; done); \
	if [ -n "$$bad" ]; then echo "format: not as .clang-format formats them (run 'make format'):"; echo "$$bad"; exit 1; fi; \
	echo "format: all $$(git ls-files '*.c' '*.h' | wc -l) C files match .clang-format"

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD)
