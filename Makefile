# Thin wrapper over CMake. `make` builds everything, `make test` runs the CPU
# suite, `make run` trains the default model, `make test-cuda` runs the GPU
# suite (on a machine with a GPU: test_cuda, test_cuda_accuracy, test_attention,
# test_op_table).
BUILD ?= build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=

.PHONY: all configure test test-cuda run bench install clean asan

all: configure
	cmake --build $(BUILD) -j $(JOBS)

configure:
	@test -f $(BUILD)/CMakeCache.txt || cmake -S . -B $(BUILD) $(CMAKE_FLAGS)

test: all
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

test-cuda: all
	$(BUILD)/tests/test_cuda
	$(BUILD)/tests/test_cuda_accuracy
	$(BUILD)/tests/test_attention
	$(BUILD)/tests/test_op_table

run: all
	$(BUILD)/nabla train

bench: all
	$(BUILD)/nabla bench

install: all
	cmake --install $(BUILD) $(if $(PREFIX),--prefix $(PREFIX),)

asan:
	$(MAKE) BUILD=build-asan CMAKE_FLAGS="-DNABLA_SANITIZE=ON -DNABLA_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo" test

clean:
	rm -rf $(BUILD) build-asan
