# Sourced (from the repository root) by tools/llamacpp_bench.sh and tools/serve_bench.sh: the
# pinned llama.cpp tree they both measure against, and the GGUF files they both read.
#
# llama.cpp comes from a source distribution on PyPI: the tree vendored in llama-cpp-python's
# sdist (pinned version and sha256 below), built once, CPU only, into tools/.work/llama.cpp.

LLAMACPP_VERSION=0.3.36
LLAMACPP_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
LLAMACPP_URL=https://files.pythonhosted.org/packages/ec/e9/e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/llama_cpp_python-$LLAMACPP_VERSION.tar.gz
LLAMACPP_WORK=tools/.work/llama.cpp
LLAMACPP_TREE=$LLAMACPP_WORK/llama_cpp_python-$LLAMACPP_VERSION/vendor/llama.cpp
LLAMACPP_BIN=$LLAMACPP_TREE/build/bin
LLAMACPP_TARGETS=(llama-bench llama-quantize llama-simple llama-server)
# Native code without Intel AMX: on the project's VM the CPU reports AMX, yet ggml's AMX matrix
# kernel dies with SIGILL at its first `tilezero` (llama-server's first batched step), so the tile
# instructions stay out. Decode (one row at a time) never reached that kernel.
LLAMACPP_CMAKE_ARGS=(-DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DGGML_CUDA=OFF -DLLAMA_BUILD_TESTS=OFF
  -DLLAMA_BUILD_SERVER=ON "-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16")

# Download (sha256-checked), unpack and build the targets above unless all are there, built with
# these arguments (kept in configure.args); then LLAMACPP_COMMIT says which llama.cpp it is.
llamacpp_build() {
  mkdir -p "$LLAMACPP_WORK"
  local t missing=0
  for t in "${LLAMACPP_TARGETS[@]}"; do [ -x "$LLAMACPP_BIN/$t" ] || missing=1; done
  [ "$(cat "$LLAMACPP_WORK/configure.args" 2> /dev/null)" = "${LLAMACPP_CMAKE_ARGS[*]}" ] || missing=1
  if [ "$missing" = 1 ]; then
    if [ ! -f "$LLAMACPP_WORK/sdist.tar.gz" ]; then
      curl -sSfL -o "$LLAMACPP_WORK/sdist.part" "$LLAMACPP_URL"
      echo "$LLAMACPP_SHA256  $LLAMACPP_WORK/sdist.part" | sha256sum -c --quiet
      mv "$LLAMACPP_WORK/sdist.part" "$LLAMACPP_WORK/sdist.tar.gz"
    fi
    tar xzf "$LLAMACPP_WORK/sdist.tar.gz" -C "$LLAMACPP_WORK"
    # the compiler's many warnings go to the logs, not the terminal
    cmake -S "$LLAMACPP_TREE" -B "$LLAMACPP_TREE/build" "${LLAMACPP_CMAKE_ARGS[@]}" > "$LLAMACPP_WORK/configure.log" 2>&1 &&
      cmake --build "$LLAMACPP_TREE/build" -j "$(nproc)" --target "${LLAMACPP_TARGETS[@]}" > "$LLAMACPP_WORK/build.log" 2>&1 ||
      { echo "llama.cpp: the build failed, see $LLAMACPP_WORK/configure.log and build.log" >&2; return 1; }
    echo "${LLAMACPP_CMAKE_ARGS[*]}" > "$LLAMACPP_WORK/configure.args"
  fi
  local c
  c=$(sed -n 's/.*LLAMA_COMMIT = "\([^"]*\)".*/\1/p' "$LLAMACPP_TREE/build/common/build-info.cpp" 2> /dev/null || true)
  LLAMACPP_COMMIT="vendored in llama-cpp-python $LLAMACPP_VERSION${c:+, commit $c}"
}

# A random Llama of shape $2 (tools/random_llama.py: 100m, the default, or 135m), made once;
# prints its folder.
llamacpp_random_model() {
  local shape=${2:-100m}
  local dir=$LLAMACPP_WORK/random-$shape
  [ -f "$dir/model.safetensors" ] || "$1" tools/random_llama.py "$dir" --shape "$shape" >&2
  echo "$dir"
}

# llamacpp_gguf_files MODEL CH09 THREADS TYPE...: MODEL's F32 GGUF, written by InferLab's
# `CH09 export --format f32`, and llama.cpp's llama-quantize of it to each TYPE, so both programs
# read files that llama.cpp made; made once in $LLAMACPP_WORK, their paths left in GGUF_FILES.
llamacpp_gguf_files() {
  local model=$1 ch09=$2 threads=$3 q f name
  shift 3
  name=$(basename "$model")
  GGUF_FILES=("$LLAMACPP_WORK/$name-f32.gguf")
  [ -f "${GGUF_FILES[0]}" ] || "$ch09" export --model "$model" --format f32 "${GGUF_FILES[0]}" >&2
  for q in "$@"; do
    f=$LLAMACPP_WORK/$name-$q.gguf
    [ -f "$f" ] || "$LLAMACPP_BIN/llama-quantize" "${GGUF_FILES[0]}" "$f" "$q" "$threads" > "$LLAMACPP_WORK/quantize-$name-$q.log" 2>&1
    GGUF_FILES+=("$f")
  done
}
