# A thin wrapper over CMake presets (CMakePresets.json). The two commands of the quick start:
#   make tour   set up, build (Release), run every chapter on the bundled model
#   make test   set up, build, run the whole test suite with ctest
# Others: make build | asan | fuzz | docs | figures | bench | lab | lab-check | grade | package | clean.
.PHONY: setup configure build tour test asan fuzz docs figures bench lab lab-check grade package clean

# WERROR=ON builds with warnings as errors (INFERLAB_WERROR), as CI does (.ci/run): `make test
# WERROR=ON`. Left out, the build folder keeps the value it was configured with (OFF at first),
# so that a newer compiler's new warnings never stop a user's build.
WERROR ?=
WERROR_FLAG = $(if $(WERROR),-DINFERLAB_WERROR=$(WERROR))

setup:
	@tools/setup.sh

configure: setup
	@cmake --preset release $(WERROR_FLAG) > build-configure.log 2>&1 || (cat build-configure.log; exit 1)
	@grep -E "InferLab CUDA backend" build-configure.log || true
	@rm -f build-configure.log

build: configure
	cmake --build --preset release

tour: build
	@tools/tour.sh build/release/bin

test: build
	ctest --preset release

# The unit tests once more under AddressSanitizer + UndefinedBehaviorSanitizer (CPU only).
asan: setup
	cmake --preset asan $(WERROR_FLAG)
	cmake --build --preset asan
	ctest --preset asan

# Every reader under libFuzzer with ASan + UBSan, FUZZ_SECONDS per target (docs/reliability.md).
FUZZ_SECONDS ?= 60
fuzz:
	@tools/fuzz.sh $(FUZZ_SECONDS)

# The Doxygen site in build/release/docs/html (warnings are errors).
docs: configure
	cmake --build --preset release --target docs

# Every chapter's figure drawn again on this machine into docs/figures/, and the gallery page
# docs/figures.md (tools/figures.sh): builds only the chapters' executables.
FIGURE_TARGETS = ch00_workload ch01_naive_decode ch02_kv_cache ch03_gqa ch04_mla ch05_cla ch06_local_attention \
  ch07_mamba ch08_diffusion_lm ch09_quantization ch10_speculative_sampling ch11_continuous_batching ch12_paged_attention
figures: configure
	cmake --build --preset release --target $(FIGURE_TARGETS)
	@tools/figures.sh build/release/bin

# The benchmarks on this machine, with the ceilings they are measured against.
bench: build
	@tools/bench.sh build/release/bin

# The course labs (docs/labs.md). `make lab DEST=dir` writes the student tree: the project with
# every exercise region replaced by its stub.
DEST ?= build/lab/student
lab:
	@tools/lab.sh student $(DEST)

# Builds the student tree and checks it: it builds without warnings, exactly the exercise tests
# fail, each with its message, and `make grade` there counts them all (and prints docs/labs.md's sample).
lab-check: build
	@tools/lab.sh check

# A score per exercise for this tree (a student's or the reference), and lab.xml, a JUnit report
# for autograders.
grade: build
	@tools/lab.sh grade build/release lab.xml

# The Debian package of the install tree (README.md, Install): build/release/inferlab_<version>_<arch>.deb.
package: build
	cmake --build --preset release --target package

clean:
	rm -rf build
