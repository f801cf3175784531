# attnserve: the two commands a newcomer needs.
#   make serve   install what is missing, build, start the server on the best backend present
#   make test    install what is missing, build, run the test suite (ctest)
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
BUILD_TYPE ?= Release
# ctest label filter: by default everything but tests labelled "slow". make test CTEST_ARGS=
CTEST_ARGS ?= -LE slow
CMAKE_ARGS ?=
SERVE_ARGS ?=

.PHONY: all bootstrap configure build test test-all serve bench clean format

all: build

bootstrap:
	@scripts/bootstrap

$(BUILD_DIR)/build.ninja: CMakeLists.txt
	cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_ARGS)

configure: bootstrap
	cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_ARGS)

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) $(CTEST_ARGS)

test-all: CTEST_ARGS=
test-all: test

serve: configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target attnserve attnctl
	@scripts/serve $(BUILD_DIR) $(SERVE_ARGS)

bench: build
	$(BUILD_DIR)/bin/attnbench --backend cpu --spec '{"dense": {}}' --batch 1 --tokens 8192 --heads 8 --head-dim 64 --dtype f32

format:
	find core server client bench tests -name '*.cc' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' | xargs clang-format -i

clean:
	rm -rf $(BUILD_DIR)
