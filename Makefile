# lattice — the two commands a newcomer needs:
#   make demo   builds everything (installing what is missing) and runs the CPU demo
#   make test   builds everything (installing what is missing) and runs the whole test suite
#
# Variables: PYTHON (default: Debian's /usr/bin/python3, which gets python3-torch),
# BUILD (build folder), CUDA=AUTO|ON|OFF, DEPS=0 to skip the package install step,
# JOBS (parallel build jobs).

PYTHON ?= $(shell test -x /usr/bin/python3 && echo /usr/bin/python3 || echo python3)
BUILD ?= build
CUDA ?= AUTO
DEPS ?= 1
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
BUILD_TYPE ?= Release

# Test-only Python packages that Debian does not ship, installed with pip into the build folder
# (never into the system Python): mlx, for the bit-exact cross-check of packed weights.
PYDEPS := $(CURDIR)/$(BUILD)/pydeps
MLX_PIN := mlx[cpu]==0.32.4

export PYTHONPATH := $(CURDIR)/python:$(PYTHONPATH)

.PHONY: all deps pydeps configure build demo test test-cpp test-python test-sanitize sanitize-build bench clean format mutants

all: build

deps:
ifeq ($(DEPS),1)
	@scripts/install_deps.sh
endif

$(BUILD)/build.ninja: CMakeLists.txt | deps
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DLATTICE_CUDA=$(CUDA) \
	  -DPython_EXECUTABLE=$(PYTHON)

configure: deps $(BUILD)/build.ninja

build: configure
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	$(PYTHON) -m lattice.demo $(ARGS)

test-cpp: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

pydeps:
	@test -d $(PYDEPS)/mlx || $(PYTHON) -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
	  --target $(PYDEPS) "$(MLX_PIN)" || echo "pydeps: could not install $(MLX_PIN); the MLX cross-check tests will skip"

test-python: build pydeps
	PYTHONPATH=$(CURDIR)/python:$(PYDEPS) $(PYTHON) -m pytest -q -p no:cacheprovider tests/oracle tests/python

test: test-cpp test-python

# Sanitizers (docs/testing.md "Sanitizers"): the CPU library, the C++ tests and the Python
# extension built with AddressSanitizer + UndefinedBehaviorSanitizer (CUDA off, -O1 -g, asserts
# on) in their own folder; runs ctest there and a Python subset (SANITIZE_PYTESTS) with libasan
# preloaded into the interpreter and the sanitized extension loaded through LATTICE_EXTENSION_DIR
# (the tree's own python/lattice/_lattice*.so is never replaced); libstdc++ is preloaded with it,
# since ASan resolves its __cxa_throw interceptor at start-up and python3 itself does not link
# libstdc++ (without it the first C++ exception aborts). Any report fails the target; pytest
# captures at the sys level only (--capture=sys), so a sanitizer's report on fd 2 reaches the log
# (fd capture swallowed it when the report ended the process).
SANITIZE_BUILD ?= build-sanitize
SANITIZE_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
SANITIZE_PYTESTS ?= tests/python/test_hardening.py tests/python/test_hardening_sweep.py \
  tests/python/test_io.py tests/python/test_io_fuzz.py tests/python/test_validation.py \
  tests/python/test_coords.py tests/python/test_pool.py tests/python/test_point_voxel.py \
  tests/python/test_index_routes.py tests/python/test_conv_oracle.py tests/python/test_algebra.py \
  tests/python/test_relations.py tests/python/test_quantize.py tests/python/test_features.py \
  tests/python/test_nn.py
SANITIZE_ENV := ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:detect_odr_violation=0 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

sanitize-build: deps
	cmake -S . -B $(SANITIZE_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Debug -DLATTICE_CUDA=OFF \
	  -DPython_EXECUTABLE=$(PYTHON) -DLATTICE_PYTHON_OUTPUT_DIR=$(CURDIR)/$(SANITIZE_BUILD)/python \
	  "-DCMAKE_CXX_FLAGS_DEBUG=-O1 -g" "-DCMAKE_CXX_FLAGS=$(SANITIZE_FLAGS)" \
	  "-DCMAKE_EXE_LINKER_FLAGS=$(SANITIZE_FLAGS)" "-DCMAKE_SHARED_LINKER_FLAGS=$(SANITIZE_FLAGS)" \
	  "-DCMAKE_MODULE_LINKER_FLAGS=$(SANITIZE_FLAGS)"
	cmake --build $(SANITIZE_BUILD) -j $(JOBS)

# ctest: install_consumer is left out (it builds an outside project against the installed archive
# with plain flags, which cannot link sanitized objects; the Release `make test` runs it). Leaks are
# checked in the C++ tests (LeakSanitizer); not in Python, whose interpreter never frees its heap.
test-sanitize: sanitize-build
	cd $(SANITIZE_BUILD) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:detect_odr_violation=0 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest --output-on-failure -j $(JOBS) -E '^install_consumer$$'
	$(SANITIZE_ENV) LD_PRELOAD="$$($(CXX) -print-file-name=libasan.so) $$($(CXX) -print-file-name=libstdc++.so)" \
	  LATTICE_EXTENSION_DIR=$(CURDIR)/$(SANITIZE_BUILD)/python PYTHONPATH=$(CURDIR)/python \
	  $(PYTHON) -m pytest -q -p no:cacheprovider --capture=sys $(SANITIZE_PYTESTS)

bench: build
	$(PYTHON) -m lattice.bench $(ARGS)

# Mutation testing (scripts/mutants.py, tests/mutants/README.md, docs/testing.md): applies each
# mutant to the tree, rebuilds incrementally in its own CUDA-off build folder, runs the tests
# mapped to it and reports killed / survived. ONLY=name[,name...] runs a subset; REPORT=file.md
# writes the markdown table; ARGS passes more options (e.g. ARGS=--list).
MUTANTS_BUILD ?= build-mutants

mutants: deps
	$(PYTHON) scripts/mutants.py --build $(MUTANTS_BUILD) --jobs $(JOBS) --python $(PYTHON) \
	  $(if $(ONLY),--only '$(ONLY)') $(if $(REPORT),--report '$(REPORT)') $(ARGS)

format:
	clang-format -i $$(git ls-files '*.h' '*.cpp' '*.cu')

clean:
	rm -rf $(BUILD) python/lattice/_lattice*.so
