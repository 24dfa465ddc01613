# AutoCompress build. `make` builds the library, the daemon and the CLI into
# build/. CUDA objects are added when nvcc is found (see `make cuda-check`).
CC      ?= gcc
CFLAGS  ?= -O2 -g
# The library's layers, one folder each, lowest first (docs/layers.md): a folder
# includes headers of itself and of the folders before it only, which
# `make check-layers` (tools/check_layers.py, part of `make test`) enforces.
# Public headers are included by folder path ("core/err.h"), a folder's
# private ones (*_int.h) by bare name from that folder only. Each folder is
# compiled against $(B)/inc/<dir> (tools/make_views.sh), which holds only the
# public headers of the folders it may use; daemon/ and tools/ against
# $(B)/inc/public, the one public header src/autocompress.h and what it names.
# tests/ and bench/ are white-box: -Isrc.
SRC_DIRS = core format runtime cost search compress pipeline api
# The folders the CUDA plugin (src/cuda) may use; it sits in the last one's layer.
CUDA_USES = core format runtime
override CFLAGS += -std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE -fPIC
PKGS     = jansson sqlite3 libuv libmicrohttpd libpcre2-8 libutf8proc libcurl gnutls
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null)
override CFLAGS += $(PKG_CFLAGS) -I/usr/include/x86_64-linux-gnu/openblas-pthread
LDLIBS  += $(PKG_LIBS) -lglpk -lopenblas -lm -lpthread
PYTHON  ?= /usr/bin/python3

NVCC    ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA_HOME ?= /usr/local/cuda

B = build
LIB_SRC  = $(foreach d,$(SRC_DIRS),$(wildcard src/$(d)/*.c))
LIB_HDR  = $(foreach d,$(SRC_DIRS),$(wildcard src/$(d)/*.h))
LIB_OBJ  = $(LIB_SRC:src/%.c=$(B)/src/%.o)
D_SRC    = $(filter-out daemon/main.c,$(wildcard daemon/*.c))
D_OBJ    = $(D_SRC:daemon/%.c=$(B)/daemon/%.o) $(B)/daemon/migrations.o
TEST_SRC = $(wildcard tests/test_*.c)
TEST_BIN = $(TEST_SRC:tests/%.c=$(B)/tests/%)
VIEWS    = $(B)/inc/.stamp
PUB_INC  = -Idaemon -I$(B)/inc/public
WB_INC   = -Isrc -Idaemon

.PHONY: all clean test check-layers demo bench cuda-check fixtures tiny-model tiny-model-retrain second-model deps asan test-asan web-test-deps llama-test-deps fuzz

BENCH_BIN = $(patsubst bench/%.c,$(B)/bench/%,$(wildcard bench/*.c))
# The CUDA plugin is built when nvcc is found; without it the CPU path alone.
CUDA_PLUGIN = $(if $(NVCC),$(B)/libac_cuda.so,)

all: $(B)/autocompressd $(B)/autocompress $(TEST_BIN) $(B)/tests/fuzz_parsers $(BENCH_BIN) $(CUDA_PLUGIN) $(B)/tests/libac_cuda_emu.so $(B)/tests/test_cuda_emu

$(VIEWS): $(LIB_HDR) $(wildcard src/cuda/*.h) src/autocompress.h tools/make_views.sh Makefile
	sh tools/make_views.sh $(B)/inc "$(SRC_DIRS)" "$(CUDA_USES)"
	@touch $@

$(B)/libac_cuda.so: $(wildcard src/cuda/*.cu src/cuda/*.h) src/cost/costmodel.h src/format/model.h src/runtime/block.c src/runtime/block.h $(VIEWS)
	$(MAKE) -C src/cuda NVCC=$(NVCC) CUDA_HOME=$(CUDA_HOME) B=$(abspath $(B)) all

# The CUDA backend compiled for the CPU against tests/cuda_emu (no nvcc
# needed): tests/run_all.sh runs test_cuda through it.
# A 5-key attention tile and 7-row logit chunks so the tests cover the online
# softmax across tiles and the head in several chunks.
EMU_CXXFLAGS = $(filter-out -std=c11,$(CFLAGS)) -std=c++17 -DAC_CUDA_EMU -DAC_ATTN_TILE=5 -DAC_LOGIT_ROWS=7 -DAC_TRAIN_TB=64 -Itests/cuda_emu
$(B)/tests/libac_cuda_emu.so: src/cuda/ac_cuda.cu src/cuda/ac_cuda.h src/cuda/ac_cuda_conv_int.h src/cuda/ac_cuda_train.cu src/cuda/ac_cuda_train_int.h src/cuda/ac_cuda_ssm.cu src/cuda/ac_cuda_ssm_int.h src/cuda/ac_cuda_reduce_int.h tests/cuda_emu/cuda_emu.cc tests/cuda_emu/cuda_emu.h src/cost/costmodel.h src/format/model.h src/runtime/train.h src/runtime/block.c src/runtime/block.h $(VIEWS)
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) -I$(B)/inc/cuda -shared -o $@ -x c++ src/cuda/ac_cuda.cu src/cuda/ac_cuda_train.cu src/cuda/ac_cuda_ssm.cu src/runtime/block.c -x none tests/cuda_emu/cuda_emu.cc -lopenblas

# The emulator's own test (threads, barriers, shuffles, faults).
$(B)/tests/test_cuda_emu: tests/cuda_emu/test_cuda_emu.cc tests/cuda_emu/cuda_emu.cc tests/cuda_emu/cuda_emu.h tests/check.h src/cuda/ac_cuda_reduce_int.h
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) -Itests -o $@ tests/cuda_emu/test_cuda_emu.cc tests/cuda_emu/cuda_emu.cc -lopenblas

# A library file sees its own folder's private headers (next to it) and the
# view of its folder: $* is dir/name, its first part the folder.
$(B)/src/%.o: src/%.c $(LIB_HDR) $(wildcard src/cuda/*.h) | $(VIEWS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -I$(B)/inc/$(firstword $(subst /, ,$*)) -c $< -o $@

$(B)/daemon/%.o: daemon/%.c $(wildcard daemon/*.h) $(LIB_HDR) | $(VIEWS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(PUB_INC) -c $< -o $@

$(B)/daemon/migrations.c: $(wildcard migrations/*.sql) tools/embed_sql.sh
	@mkdir -p $(dir $@)
	sh tools/embed_sql.sh $@ $(sort $(wildcard migrations/*.sql))

$(B)/daemon/migrations.o: $(B)/daemon/migrations.c daemon/db.h | $(VIEWS)
	$(CC) $(CFLAGS) $(PUB_INC) -c $< -o $@


$(B)/libautocompress.a: $(LIB_OBJ)
	ar rcs $@ $^

$(B)/autocompressd: $(B)/daemon/main.o $(D_OBJ) $(B)/libautocompress.a
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(B)/daemon/main.o: daemon/main.c $(wildcard daemon/*.h) $(LIB_HDR) | $(VIEWS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(PUB_INC) -c $< -o $@

# The CLI and the benchmarks link the daemon's objects for the SQLite cost
# cache (daemon/costcache.c over the migrations' schema).
# The CLI's daemon client (tools/remote.c, tools/http_client.c) uses libcurl;
# nothing else links it.
CURL_CFLAGS := $(shell pkg-config --cflags libcurl 2>/dev/null)
CURL_LIBS   := $(shell pkg-config --libs libcurl 2>/dev/null || echo -lcurl)
CLI_SRC = tools/autocompress.c tools/remote.c tools/http_client.c
$(B)/autocompress: $(CLI_SRC) tools/remote.h tools/http_client.h $(D_OBJ) $(B)/libautocompress.a | $(VIEWS)
	$(CC) $(CFLAGS) $(CURL_CFLAGS) -Itools $(PUB_INC) -o $@ $(CLI_SRC) $(D_OBJ) $(B)/libautocompress.a $(LDLIBS) $(CURL_LIBS)

$(B)/tests/%: tests/%.c tests/check.h tests/synth.h tests/synth_cost.h $(B)/libautocompress.a $(D_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests $(WB_INC) -o $@ $< $(D_OBJ) $(B)/libautocompress.a $(LDLIBS)

FUZZ_DAEMON = $(B)/daemon/config.o $(B)/daemon/executor_config.o $(B)/daemon/wevent.o
$(B)/tests/fuzz_parsers: tests/fuzz_parsers.c $(FUZZ_DAEMON) $(B)/libautocompress.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(WB_INC) -o $@ $^ $(LDLIBS)

# The same entry as a libFuzzer target (clang): build/fuzz/fuzz_parsers.
# Run one parser for N minutes: build/fuzz/fuzz_parsers -max_total_time=$$((N*60)) build/fuzz/corpus
# (the first byte of each input picks the parser; see tests/fuzz_parsers.c).
FUZZ_CC ?= clang
fuzz:
	@mkdir -p $(B)/fuzz/corpus
	$(FUZZ_CC) -g -O1 -fsanitize=fuzzer,address,undefined -DAC_LIBFUZZER -std=c11 -D_GNU_SOURCE $(WB_INC) $(PKG_CFLAGS) \
	  -I/usr/include/x86_64-linux-gnu/openblas-pthread -o $(B)/fuzz/fuzz_parsers tests/fuzz_parsers.c $(LIB_SRC) \
	  daemon/config.c daemon/executor_config.c daemon/wevent.c $(LDLIBS)
	$(MAKE) $(B)/tests/fuzz_parsers
	$(B)/tests/fuzz_parsers --seeds $(B)/fuzz/corpus
	@echo "built $(B)/fuzz/fuzz_parsers; seeds in $(B)/fuzz/corpus"

$(B)/bench/%: bench/%.c $(D_OBJ) $(B)/libautocompress.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(WB_INC) -o $@ $< $(D_OBJ) $(B)/libautocompress.a $(LDLIBS)

# Debian packages the build, the tests and the demo need; Node.js, npm and
# Chromium (dashboard test) only when missing, and failure there only skips
# that test (a nodesource nodejs conflicts with Debian's npm, for example).
deps:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -qq && apt-get install -y -qq --no-install-recommends \
	    build-essential pkg-config libjansson-dev libsqlite3-dev libuv1-dev libmicrohttpd-dev libpcre2-dev libutf8proc-dev \
	    libopenblas-dev libglpk-dev libcurl4-openssl-dev libgnutls28-dev python3 python3-torch python3-numpy python3-regex python3-sentencepiece python3-jsonschema python3-yaml fortunes bible-kjv bible-kjv-text curl ca-certificates >/dev/null; \
	  opt=""; command -v node >/dev/null || opt="$$opt nodejs"; command -v npm >/dev/null || opt="$$opt npm"; \
	  command -v chromium >/dev/null || opt="$$opt chromium"; \
	  if [ -n "$$opt" ]; then apt-get install -y -qq --no-install-recommends $$opt >/dev/null || \
	    echo "deps: could not install$$opt; the dashboard test will be skipped"; fi; \
	else echo "deps: not root or no apt-get; assuming packages are installed"; fi

# The tiny model trained on fortunes (reproducible; cached in build/). The
# script splits the text into build/data and, when tests/models/tiny was
# trained by it on the same split and settings (its inputs.json), copies that
# model instead of training 4.5 minutes; tiny-model-retrain trains the
# committed one again (after a change to the script's training or the text).
TINY_COMMITTED = tests/models/tiny
tiny-model: $(B)/models/tiny/config.json
$(B)/models/tiny/config.json: tools/make_tiny_model.py tests/ref_llama.py $(wildcard $(TINY_COMMITTED)/*)
	@mkdir -p $(B)/models
	PYTHONPATH=tests $(PYTHON) tools/make_tiny_model.py --out $(B)/models/tiny --data $(B)/data --committed $(TINY_COMMITTED)
tiny-model-retrain:
	PYTHONPATH=tests $(PYTHON) tools/make_tiny_model.py --out $(TINY_COMMITTED) --data $(B)/data --write-inputs
	rm -f $(B)/models/tiny/config.json
	$(MAKE) tiny-model

# The second, larger model for the benchmarks (11M parameters, King James
# Bible from bible-kjv-text; reproducible; one thread: about 2.7 CPU-s a step, 240 steps in about 11 CPU-minutes).
SECOND_ARGS = --corpus kjv --merges 767 --hidden 320 --layers 8 --heads 10 --kv-heads 5 --ffn 1024 \
	--ctx 128 --batch 16 --steps 240 --bpe-chars 600000 --threads 1 --eval
second-model: $(B)/models/second/config.json
$(B)/models/second/config.json: tools/make_tiny_model.py tests/ref_llama.py
	@mkdir -p $(B)/models
	PYTHONPATH=tests $(PYTHON) tools/make_tiny_model.py --out $(B)/models/second --data $(B)/data/second $(SECOND_ARGS)

fixtures: tiny-model
	PYTHONPATH=tests $(PYTHON) tests/gen_fixtures.py --out $(B)/fixtures
	PYTHONPATH=tests $(PYTHON) tests/gen_grad_fixtures.py --out $(B)/fixtures

test: check-layers all fixtures web-test-deps llama-test-deps
	bash tests/run_all.sh

# No upward include, no include cycle (docs/layers.md).
check-layers:
	$(PYTHON) tools/check_layers.py

# playwright-core for the dashboard test (skipped when npm or chromium is absent)
web-test-deps:
	@if command -v npm >/dev/null && [ ! -d tests/web/node_modules/playwright-core ]; then \
	  (cd tests/web && npm ci --no-audit --no-fund >/dev/null 2>&1) || echo "web-test-deps: npm ci failed; dashboard test will be skipped"; fi

# llama.cpp for test_gguf: node-llama-cpp with only its prebuilt linux-x64
# CPU binaries (other platforms' optional packages skipped, no install
# scripts: nothing is downloaded or built at install). Versions from
# tests/llama/package-lock.json; `npm ci` refuses that lock because npm
# leaves other platforms' optional packages out of it, so `npm install
# --no-save` (which follows the lock and leaves it as it is). Needs node >= 20;
# without it test_gguf skips its llama.cpp test and says why.
llama-test-deps:
	@if command -v npm >/dev/null && [ ! -d tests/llama/node_modules/@node-llama-cpp/linux-x64 ]; then \
	  (cd tests/llama && npm install --no-save --omit=optional --ignore-scripts --no-audit --no-fund >/dev/null 2>&1) || \
	  echo "llama-test-deps: npm install failed; the llama.cpp part of test_gguf will be skipped"; fi

# deps first, then a fresh make: the pkg-config flags above are read when
# make starts, before deps has installed the libraries they name.
demo: deps
	$(MAKE) all tiny-model
	bash tools/demo.sh

bench: all tiny-model
	bash bench/run_all.sh

# The C tests and the parser fuzzer under AddressSanitizer + UBSan, with
# float-to-int conversions checked too (GCC's -fsanitize=undefined leaves
# float-cast-overflow out); any finding stops the program.
ASAN_FLAGS = -O1 -g -fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=all -fno-omit-frame-pointer
asan:
	$(MAKE) B=build-asan NVCC= CFLAGS="$(ASAN_FLAGS)" all

test-asan: asan fixtures
	AC_BUILD=$(B) ASAN_OPTIONS=detect_leaks=0 build-asan/tests/test_safetensors
	AC_BUILD=$(B) ASAN_OPTIONS=detect_leaks=0 build-asan/tests/test_tokenizer
	AC_BUILD=$(B) ASAN_OPTIONS=detect_leaks=0 build-asan/tests/test_gguf_bounds
	AC_BUILD=$(B) ASAN_OPTIONS=detect_leaks=0 build-asan/tests/test_engine
	AC_BUILD=$(B) ASAN_OPTIONS=detect_leaks=0 build-asan/tests/test_costsearch
	AC_BUILD=$(B) ASAN_OPTIONS=detect_leaks=0 build-asan/tests/test_train
	AC_BUILD=$(B) build-asan/tests/test_dnas
	ASAN_OPTIONS=detect_leaks=0 build-asan/tests/test_cuda_emu
	AC_BUILD=$(B) ASAN_OPTIONS=detect_leaks=0 AC_CUDA_PLUGIN=$(abspath build-asan/tests/libac_cuda_emu.so) build-asan/tests/test_cuda
	AC_BUILD=$(B) ASAN_OPTIONS=detect_leaks=0 AC_TRAIN_CUDA_ONLY=1 AC_CUDA_PLUGIN=$(abspath build-asan/tests/libac_cuda_emu.so) build-asan/tests/test_train
	ASAN_OPTIONS=detect_leaks=0 build-asan/tests/fuzz_parsers 100000 3
	ASAN_OPTIONS=detect_leaks=0 build-asan/tests/fuzz_parsers --extremes

cuda-check:
	@test -n "$(NVCC)" || { echo "cuda-check: nvcc not found (PATH or /usr/local/cuda/bin)"; exit 1; }
	$(MAKE) -C src/cuda NVCC=$(NVCC) CUDA_HOME=$(CUDA_HOME) B=$(abspath $(B)) check

clean:
	rm -rf $(B) build-asan
