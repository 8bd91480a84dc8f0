# Builds ./train and the test programs.
#   make            CPU + CUDA build (needs the CUDA toolkit; runs on machines without a GPU)
#   make CUDA=0     CPU-only build
#   make test       builds and runs the test suite (pytest over tests/)
# Dependencies: scripts/setup.sh installs them.

CUDA ?= $(if $(wildcard $(CUDA_HOME)/bin/nvcc),1,0)
CUDA_HOME ?= /usr/local/cuda
BUILD ?= build
BIN ?= train
HDF5_PC ?= $(shell pkg-config --exists hdf5-serial && echo hdf5-serial || echo hdf5)
PY ?= python3

CXX := mpicxx
NVCC := $(CUDA_HOME)/bin/nvcc
# the revision the run log records (`git_rev`): HEAD, "-dirty" when tracked files differ from it
GIT_REV := $(shell git describe --always --dirty --abbrev=7 2>/dev/null || echo unknown)

define need
$(if $(shell $(1) >/dev/null 2>&1 && echo ok),,$(error $(2) not found: $(3) (or run scripts/setup.sh)))
endef
ifeq ($(filter clean,$(MAKECMDGOALS)),)
$(call need,which mpicxx,OpenMPI compiler wrapper mpicxx,apt-get install libopenmpi-dev openmpi-bin)
$(call need,pkg-config --exists yaml-cpp,yaml-cpp,apt-get install libyaml-cpp-dev)
$(call need,pkg-config --exists $(HDF5_PC),HDF5,apt-get install libhdf5-dev)
$(call need,test -f /usr/include/xxhash.h,xxHash,apt-get install libxxhash-dev)
$(call need,test -f /usr/include/boost/program_options.hpp,Boost.Program_options,apt-get install libboost-program-options-dev)
$(call need,test -f /usr/include/nlohmann/json.hpp,nlohmann-json,apt-get install nlohmann-json3-dev)
$(call need,test -f /usr/include/gmock/gmock.h,GoogleTest and GoogleMock,apt-get install libgtest-dev libgmock-dev)
$(call need,test -f /usr/include/x86_64-linux-gnu/cblas.h -o -f /usr/include/cblas.h -o -f /usr/include/openblas/cblas.h,OpenBLAS (cblas.h),apt-get install libopenblas-dev)
endif

CPPFLAGS := -Isrc -I. -DOMPI_SKIP_MPICXX=1 $(shell pkg-config --cflags yaml-cpp $(HDF5_PC) nlohmann_json)
CXXFLAGS ?= -O3 -march=x86-64-v2 -g
CXXFLAGS += -std=c++17 -fopenmp -Wall -Wextra -Wno-unused-parameter
LDLIBS := -Wl,--as-needed $(shell pkg-config --libs yaml-cpp $(HDF5_PC)) -lboost_program_options -lxxhash -lopenblas -lgomp -lpthread

# every source under src/ but main and the no-CUDA stubs (*_stub.cpp: what a .cu file defines, for builds
# without CUDA); objects mirror the folders under $(BUILD)/
STUB_SRC := $(shell find src -name '*_stub.cpp')
CORE_SRC := $(filter-out src/cli/main.cpp $(STUB_SRC),$(shell find src -name '*.cpp'))
CORE_OBJ := $(CORE_SRC:src/%.cpp=$(BUILD)/%.o) $(BUILD)/revision.o
# Header dependencies are found by the compilers: every object writes a .d file beside it (-MMD: the headers
# it includes from the project; -MP: an empty rule for each, so a deleted header is no error), and the .d files
# are included at the end, so an edit rebuilds only the objects that include what changed. A test program
# writes its .d as a hidden file beside it (.test_x.d), out of the way of the globs that find the programs.
DEPFLAGS = -MMD -MP

ifeq ($(CUDA),1)
CUDNN_FE_INC ?= $(shell $(PY) -c 'import sysconfig;print(sysconfig.get_paths()["purelib"])' 2>/dev/null)/include
$(if $(wildcard $(CUDNN_FE_INC)/cudnn_frontend.h),,$(if $(filter clean,$(MAKECMDGOALS)),,$(error cudnn_frontend.h not found in $(CUDNN_FE_INC): $(PY) -m pip install --no-deps nvidia-cudnn-frontend (its headers; or run scripts/setup.sh), or set CUDNN_FE_INC)))
NVCCFLAGS ?= -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 --expt-relaxed-constexpr -lineinfo
NVCCFLAGS += -Isrc -I. -I$(CUDNN_FE_INC) -Xcompiler -fopenmp $(shell pkg-config --cflags-only-I $(HDF5_PC))
CU_SRC := $(wildcard kernels/*.cu) $(shell find src -name '*.cu')
CU_OBJ := $(patsubst %.cu,$(BUILD)/cu/%.o,$(CU_SRC))
LDLIBS += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart -lcublasLt -lcublas -lcudnn -lnccl -lnvrtc
else
CU_OBJ := $(STUB_SRC:src/%.cpp=$(BUILD)/%.o)
endif

TEST_SRC := $(wildcard tests/cpu/test_*.cpp) $(if $(filter 1,$(CUDA)),$(wildcard tests/gpu/test_*.cpp))
TEST_BIN := $(patsubst tests/%.cpp,$(BUILD)/tests/%,$(TEST_SRC))
BENCH_BIN := $(if $(filter 1,$(CUDA)),$(BUILD)/bench/gemm_algos $(BUILD)/bench/attention_plans $(BUILD)/bench/attention_fp8 $(BUILD)/bench/host_pinning)

.PHONY: all test clean quickstart
all: $(BIN) $(TEST_BIN) $(BENCH_BIN)

$(BIN): $(BUILD)/cli/main.o $(CORE_OBJ) $(CU_OBJ)
	$(CXX) $(CXXFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/%.o: src/%.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(CPPFLAGS) $(CXXFLAGS) $(DEPFLAGS) -c -o $@ $<

# The revision (base/revision.hpp) as a source file rewritten only when it changes: a new commit rebuilds
# that one object (a -D flag would leave objects built before the commit with the old revision).
REV_DEF := namespace gpt { const char* build_revision() { return "$(GIT_REV)"; } }
ifeq ($(filter clean,$(MAKECMDGOALS)),)
$(shell mkdir -p $(BUILD) && (echo '$(REV_DEF)' | cmp -s - $(BUILD)/revision.cpp || echo '$(REV_DEF)' > $(BUILD)/revision.cpp))
endif
$(BUILD)/revision.o: $(BUILD)/revision.cpp
	$(CXX) $(CXXFLAGS) -c -o $@ $<

# the optimizer's host loops for x86-64-v3, chosen at run time where the CPU has AVX2 and FMA
# (src/optim/step.hpp); no contraction, so that they compute what the x86-64-v2 build computes
$(BUILD)/optim/step_cpu_fma.o: CXXFLAGS += -march=x86-64-v3 -ffp-contract=off

$(BUILD)/cu/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $(DEPFLAGS) -MF $(@:.o=.d) -c -o $@ $<

# GoogleTest: a test program with a main of its own keeps it (gtest_main's is not pulled in then)
TEST_LIBS := -lgmock -lgtest_main -lgtest
$(BUILD)/tests/%: tests/%.cpp $(CORE_OBJ) $(CU_OBJ)
	@mkdir -p $(dir $@)
	$(CXX) $(CPPFLAGS) -Itests $(CXXFLAGS) $(DEPFLAGS) -MT $@ -MF $(dir $@).$(notdir $@).d -o $@ $< $(CORE_OBJ) $(CU_OBJ) $(TEST_LIBS) $(LDLIBS)

# kept: scripts/bundle.sh relinks the benchmarks from their objects
.PRECIOUS: $(BUILD)/cu/%.o $(BUILD)/cu/kernels/%.o
$(BUILD)/bench/%: $(BUILD)/cu/bench/%.o $(CORE_OBJ) $(CU_OBJ)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -o $@ $^ $(LDLIBS)

test: all
	$(PY) -m pytest -v -rs tests

quickstart: $(BIN)
	./train --yaml experiments/quickstart.yaml

clean:
	rm -rf $(BUILD) train

# the header dependencies the compilers wrote (none before the first build)
-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)

# make print-VAR: a variable's value as the recipes pass it to the shell (scripts/bundle.sh relinks with them)
print-%:
	$(info $($*))@:
