# attnserve: the two commands a newcomer needs.
#   make serve   install what is missing, build, start the server on the best backend present
#   make test    install what is missing, build, run the test suite (ctest)
#   make sanitize  the CPU tests under ASan + UBSan, then the concurrency tests under TSan
#   make fuzz      the libFuzzer targets, FUZZ_SECONDS each (docs/DEVELOPERS.md)
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
BUILD_TYPE ?= Release
# ctest label filter: by default everything but tests labelled "slow". make test CTEST_ARGS=
CTEST_ARGS ?= -LE slow
CMAKE_ARGS ?=
SERVE_ARGS ?=

.PHONY: all bootstrap configure build test test-all serve bench clean format
.PHONY: sanitize sanitize-asan sanitize-tsan fuzz

# Sanitizer and fuzz builds: CPU only, Debug at -O1, each in its own build directory, building
# only the tests they run (cmake/Sanitizers.cmake, tests/sanitizers/, tests/fuzz/).
ASAN_BUILD_DIR ?= build-asan
TSAN_BUILD_DIR ?= build-tsan
FUZZ_BUILD_DIR ?= build-fuzz
FUZZ_SECONDS ?= 60
SAN_CMAKE_ARGS ?=
SAN_CONFIGURE = cmake -S . -G Ninja -DCMAKE_BUILD_TYPE=Debug -DATTNSERVE_ENABLE_CUDA=OFF $(SAN_CMAKE_ARGS)

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

sanitize: sanitize-asan sanitize-tsan

sanitize-asan: bootstrap
	$(SAN_CONFIGURE) -B $(ASAN_BUILD_DIR) -DATTNSERVE_SANITIZER=address
	cmake --build $(ASAN_BUILD_DIR) -j $(JOBS) --target sanitizer_tests
	cd $(ASAN_BUILD_DIR) && ctest --output-on-failure -j $(JOBS) -L asan

sanitize-tsan: bootstrap
	$(SAN_CONFIGURE) -B $(TSAN_BUILD_DIR) -DATTNSERVE_SANITIZER=thread
	cmake --build $(TSAN_BUILD_DIR) -j $(JOBS) --target sanitizer_tests
	cd $(TSAN_BUILD_DIR) && ctest --output-on-failure -j $(JOBS) -L tsan

# scripts/fuzz configures FUZZ_BUILD_DIR with clang, builds, and fuzzes each target on its corpus.
fuzz: bootstrap
	FUZZ_CMAKE_ARGS="$(SAN_CMAKE_ARGS)" scripts/fuzz --build-dir $(FUZZ_BUILD_DIR) --seconds $(FUZZ_SECONDS) --jobs $(JOBS)

serve: configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target attnserve attnctl
	@scripts/serve $(BUILD_DIR) $(SERVE_ARGS)

bench: build
	$(BUILD_DIR)/bin/attnbench --backend cpu --spec '{"dense": {}}' --batch 1 --tokens 8192 --heads 8 --head-dim 64 --dtype f32

format:
	find core server client bench tests -name '*.cc' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' | xargs clang-format -i

clean:
	rm -rf $(BUILD_DIR)
