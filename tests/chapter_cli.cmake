# The chapters' executables on command lines that used to go wrong: each test runs one and
# matches its output (PASS: what it must say; FAIL: what it must never print, such as work done
# before a refusal, or a NaN). Included from chapters/CMakeLists.txt when tests are built.
#
# inferlab_cli_test(<name> PASS <regex> [FAIL <regex>] [LAB <id>] COMMAND <executable> <args>...)
# LAB: the last exercise the run needs (docs/labs.md), as tests/lab_tests.txt gives it for the
# GoogleTest programs: in a student tree the test fails with that exercise's message.
function(inferlab_cli_test name)
  cmake_parse_arguments(T "" "PASS;FAIL;LAB" "COMMAND" ${ARGN})
  add_test(NAME ${name} COMMAND ${T_COMMAND})
  set(labels "unit")
  if(T_LAB)
    set(labels "unit;lab;ex${T_LAB}")
  endif()
  set_tests_properties(${name} PROPERTIES LABELS "${labels}" PASS_REGULAR_EXPRESSION "${T_PASS}"
    ENVIRONMENT "OMP_NUM_THREADS=1;OMP_WAIT_POLICY=PASSIVE")
  if(T_FAIL)
    set_tests_properties(${name} PROPERTIES FAIL_REGULAR_EXPRESSION "${T_FAIL}")
  endif()
endfunction()

set(out "${CMAKE_CURRENT_BINARY_DIR}/cli_test_output")
file(MAKE_DIRECTORY "${out}")
file(WRITE "${out}/a_file" "not a folder")

# Every chapter's bare run takes --json (chapter 00's used to refuse it).
inferlab_cli_test(ch00_workload.BareRunWritesJson PASS "numbers in the lecture recomputed" LAB 00.4
  COMMAND ch00_workload --json "${out}/ch00_bare.json")

# An output or input path is checked before any work: these used to fail after the whole run.
inferlab_cli_test(ch00_workload.JsonPathIsCheckedBeforeMeasuring
  PASS "--json: cannot write /nonexistent/dir/x.json: folder /nonexistent/dir does not exist" FAIL "Measuring"
  COMMAND ch00_workload roofline --json /nonexistent/dir/x.json)
inferlab_cli_test(ch00_workload.PointsAreCheckedBeforeMeasuring
  PASS "--points: cannot open roofline points /nonexistent" FAIL "Measuring"
  COMMAND ch00_workload roofline --points /nonexistent)
inferlab_cli_test(ch00_workload.SvgPathIsCheckedFirst PASS "--svg: cannot write /nonexistent/p.svg" FAIL "Memory-bound"
  COMMAND ch00_workload latency --svg /nonexistent/p.svg)
inferlab_cli_test(ch08_diffusion_lm.JsonPathIsCheckedBeforeTheTable
  PASS "--json: cannot write /nonexistent/x: folder /nonexistent does not exist" FAIL "steps R"
  COMMAND ch08_diffusion_lm quality --json /nonexistent/x)
inferlab_cli_test(ch09_quantization.ExportPathIsCheckedFirst PASS "output: cannot write /nonexistent/m.gguf"
  COMMAND ch09_quantization export /nonexistent/m.gguf)
# Outputs that are not regular files are refused, never replaced (as root, the rename used to put a
# file in /dev/null's place); two outputs to one path are refused; a writer stopped by a file size
# limit (SIGXFSZ, now ignored so that the write fails) leaves no temporary file behind.
inferlab_cli_test(ch09_quantization.ADeviceIsNotAnExportTarget
  PASS "output: cannot write /dev/null: it is a character device, not a regular file"
  COMMAND ch09_quantization export /dev/null)
inferlab_cli_test(ch06_local_attention.TwoPlotsToOneFileAreRefused
  PASS "--reach-svg: ${out}/same.svg is also the path of --svg" FAIL "influence"
  COMMAND ch06_local_attention recall --svg "${out}/same.svg" --reach-svg "${out}/same.svg")
# Chapter 06's hybrid in a real family: Gemma 3 27B's 52 local layers of 1024 and 10 global ones
# at 128K tokens hold 10.4 GiB in bf16 against 62 GiB with every layer global.
inferlab_cli_test(ch06_local_attention.GemmaCacheAgainstAllGlobal
  PASS "gemma-3-27b +52 local .W = 1024., 10 global .* 10.4 GiB / +62 GiB \\( 6.0×\\)" LAB 06.1
  COMMAND ch06_local_attention gemma)
file(MAKE_DIRECTORY "${out}/fsize")
inferlab_cli_test(ch09_quantization.AFileSizeLimitLeavesNoTemporaryFile
  PASS "m.gguf: File too large.*status 1.left: +END" FAIL "m\\.gguf\\.tmp"
  COMMAND sh -c "rm -rf \"$2\" && mkdir -p \"$2\"\nulimit -f 64\n\"$1\" export \"$2/m.gguf\"\necho \"status $?\"\necho left: $(ls \"$2\") END" sh
  $<TARGET_FILE:ch09_quantization> "${out}/fsize")
# Seeds are read exactly (-1, '' and 2^64 + 1 were taken), the model a flag stands for is never
# silently replaced, and a file of one format is named when it is given for another.
inferlab_cli_test(ch08_diffusion_lm.ANegativeSeedIsRefused PASS "--seed: '-1' is not a seed" FAIL "prompt:"
  COMMAND ch08_diffusion_lm canvas --seed -1)
inferlab_cli_test(ch11_continuous_batching.ASeedBeyond2To64IsRefused
  PASS "--seed: 18446744073709551617 is beyond the largest seed" COMMAND ch11_continuous_batching trace --seed
  18446744073709551617)
inferlab_cli_test(ch11_continuous_batching.RandomAndModelAreRefusedTogether PASS "--model excludes --random"
  COMMAND ch11_continuous_batching trace --random --model "${PROJECT_SOURCE_DIR}/data/models/tiny-mha")
file(WRITE "${out}/a_file.bin" "not a checkpoint")
inferlab_cli_test(ch09_quantization.ALlama2cFileIsNotAnExportModel
  PASS "--model ${out}/a_file.bin: export takes a Hugging Face model folder" COMMAND ch09_quantization export
  "${out}/never.gguf" --model "${out}/a_file.bin")
inferlab_cli_test(ch01_naive_decode.ConvertFolderIsCheckedFirst
  PASS "output: cannot write ${out}/a_file/hf: .*a_file is a file, not a folder"
  COMMAND ch01_naive_decode convert "${PROJECT_SOURCE_DIR}/data/models/tiny-mha" "${out}/a_file/hf" --to hf)

# An empty prompt starts from BOS: tokens are generated, and no exponent is fitted to one step.
# (tiny-mha's greedy first token after BOS ends the text, and the run says so; sampled, it mostly
# tells a story.) The empty argument goes to add_test itself: a list would drop it.
add_test(NAME ch01_naive_decode.EmptyPromptStartsFromBos COMMAND ch01_naive_decode --prompt "" --max-new-tokens 6)
add_test(NAME ch01_naive_decode.EmptyPromptStartsFromBosAndSamples
  COMMAND ch01_naive_decode --prompt "" --max-new-tokens 12 --temperature 1 --seed 4)
set_tests_properties(ch01_naive_decode.EmptyPromptStartsFromBos PROPERTIES LABELS "unit;lab;ex01.2"
  PASS_REGULAR_EXPRESSION "1 tokens in [0-9.]+ ms .*the model ended the text" FAIL_REGULAR_EXPRESSION "T\\^[-a-z]")
set_tests_properties(ch01_naive_decode.EmptyPromptStartsFromBosAndSamples PROPERTIES LABELS "unit;lab;ex01.2"
  PASS_REGULAR_EXPRESSION "[0-9]+ tokens in [0-9.]+ ms" FAIL_REGULAR_EXPRESSION "T\\^[-a-z]")
inferlab_cli_test(ch01_naive_decode.OneStepFitsNoExponent PASS "With 1 step there is no growth to fit" FAIL "T\\^[-a-z]" LAB 01.2
  COMMAND ch01_naive_decode --max-new-tokens 1)
# A prompt longer than the context is refused before it is echoed.
string(REPEAT "Once upon a time " 400 long_prompt)
inferlab_cli_test(ch01_naive_decode.ALongPromptIsRefusedBeforeItIsEchoed
  PASS "longer than the model's context of 512" FAIL "Once upon a time Once upon a time"
  COMMAND ch01_naive_decode --prompt "${long_prompt}")
inferlab_cli_test(ch01_naive_decode.HelpListsEveryDtype PASS "Weight dtype: f32, bf16 or f16"
  COMMAND ch01_naive_decode --help)
inferlab_cli_test(ch00_workload.DtypeIsCheckedAndListed PASS "--dtype: f64 not in" FAIL "Arithmetic"
  COMMAND ch00_workload intensity --dtype f64)

# Values outside what a command can do are usage errors naming the flag.
inferlab_cli_test(ch10_speculative_sampling.GammaZeroIsRefused PASS "--gamma: 0 is outside \\[1, 64\\]" FAIL "speed-up"
  COMMAND ch10_speculative_sampling sweep --gamma 0)
inferlab_cli_test(ch08_diffusion_lm.StepsBeyondTheLengthAreRefusedFirst
  PASS "--steps 16 is more than --gen-length 8" FAIL "autoregressive"
  COMMAND ch08_diffusion_lm speed --gen-length 8 --steps 16)

# Each chapter's --svg run writes a figure that parses, with its axis labels and a data series
# (tests/check_figures.py runs the command, then reads the file), at the smallest settings. LAB
# as for inferlab_cli_test: the last exercise the run needs.
find_package(Python3 COMPONENTS Interpreter)
function(inferlab_svg_test name)
  cmake_parse_arguments(T "" "FILE;LAB" "COMMAND" ${ARGN})
  # Under the sanitizers these runs (whole chapter measurements) take minutes each and check the
  # figure's form, not memory: the Release build runs them, the sanitizer build the unit tests.
  if(INFERLAB_SANITIZE)
    return()
  endif()
  if(NOT Python3_Interpreter_FOUND)
    message(STATUS "No python3: ${name} is not registered")
    return()
  endif()
  add_test(NAME ${name} COMMAND Python3::Interpreter "${PROJECT_SOURCE_DIR}/tests/check_figures.py" --run "${T_FILE}" --
    ${T_COMMAND})
  set_tests_properties(${name} PROPERTIES LABELS "unit;lab;ex${T_LAB}" PASS_REGULAR_EXPRESSION
    "well-formed, with both axis labels" ENVIRONMENT "OMP_NUM_THREADS=1;OMP_WAIT_POLICY=PASSIVE" TIMEOUT 300)
endfunction()
inferlab_svg_test(ch01_naive_decode.SvgParses FILE "${out}/ch01.svg" LAB 01.2
  COMMAND $<TARGET_FILE:ch01_naive_decode> --max-new-tokens 4 --svg "${out}/ch01.svg")
inferlab_svg_test(ch02_kv_cache.SvgParses FILE "${out}/ch02.svg" LAB 02.3
  COMMAND $<TARGET_FILE:ch02_kv_cache> --max-new-tokens 4 --repeats 1 --svg "${out}/ch02.svg")
inferlab_svg_test(ch03_gqa.SvgParses FILE "${out}/ch03.svg" LAB 03.3 COMMAND $<TARGET_FILE:ch03_gqa> --svg "${out}/ch03.svg")
inferlab_svg_test(ch05_cla.SvgParses FILE "${out}/ch05.svg" LAB 05.3
  COMMAND $<TARGET_FILE:ch05_cla> throughput --seq 64 --memory-mb 1 --layers 2 --shares 1,2 --steps 1 --svg "${out}/ch05.svg")
inferlab_svg_test(ch07_mamba.SpeedSvgParses FILE "${out}/ch07_speed.svg" LAB 07.2
  COMMAND $<TARGET_FILE:ch07_mamba> speed --layers 1 --positions 16,64 --steps 1 --svg "${out}/ch07_speed.svg")
inferlab_svg_test(ch07_mamba.RecallSvgParses FILE "${out}/ch07_recall.svg" LAB 07.2
  COMMAND $<TARGET_FILE:ch07_mamba> recall --windows 1 --probes-per-kind 2 --svg "${out}/ch07_recall.svg")
inferlab_svg_test(ch08_diffusion_lm.SpeedSvgParses FILE "${out}/ch08_speed.svg" LAB 08.2
  COMMAND $<TARGET_FILE:ch08_diffusion_lm> speed --gen-length 8 --steps 8,2 --reps 1 --svg "${out}/ch08_speed.svg")
inferlab_svg_test(ch08_diffusion_lm.CanvasSvgParses FILE "${out}/ch08_canvas.svg" LAB 08.2
  COMMAND $<TARGET_FILE:ch08_diffusion_lm> canvas --gen-length 8 --steps 4 --block-length 8 --svg "${out}/ch08_canvas.svg")
inferlab_svg_test(ch09_quantization.SvgParses FILE "${out}/ch09.svg" LAB 09.1
  COMMAND $<TARGET_FILE:ch09_quantization> --svg "${out}/ch09.svg")
inferlab_svg_test(ch10_speculative_sampling.SvgParses FILE "${out}/ch10.svg" LAB 10.3
  COMMAND $<TARGET_FILE:ch10_speculative_sampling> sweep --max-new-tokens 8 --gamma 1,2 --reps 1 --svg "${out}/ch10.svg")
# One budget for every kind of layer: each model's bytes per sequence and what ran, and the
# comparison lines computed from them.
inferlab_cli_test(ch12_paged_attention.KindsComparesEachKindOfLayer
  PASS "tiny-mamba against tiny-mha: [0-9.]+x the KV bytes of a 256-position sequence, [0-9.]+x the sequences per step"
  LAB 12.3 COMMAND ch12_paged_attention kinds --requests 6
  --models "${PROJECT_SOURCE_DIR}/data/models/tiny-mha,${PROJECT_SOURCE_DIR}/data/models/tiny-mamba")
inferlab_svg_test(ch12_paged_attention.WasteSvgParses FILE "${out}/ch12_waste.svg" LAB 12.3
  COMMAND $<TARGET_FILE:ch12_paged_attention> memory --requests 4 --more-block-sizes 64 --svg "${out}/ch12_waste.svg")
inferlab_svg_test(ch12_paged_attention.BlockTableSvgParses FILE "${out}/ch12_table.svg" LAB 12.3
  COMMAND $<TARGET_FILE:ch12_paged_attention> sharing --samples 2 --svg "${out}/ch12_table.svg")
inferlab_cli_test(ch03_gqa.SvgPathIsCheckedFirst PASS "--svg: cannot write /nonexistent/p.svg" FAIL "Grouped-query"
  COMMAND ch03_gqa --svg /nonexistent/p.svg)

# Chapter 13's server: the demo serves on a loopback port and stops by itself; what only a
# listening server uses is refused with the demo; a missing model or template is named before
# anything listens.
inferlab_cli_test(ch13_serve.DemoServesMeasuresAndStops PASS "prefix caching cuts the time to first token" LAB 13.2
  FAIL "failed\\)" COMMAND ch13_serve demo --concurrency 1 2 --requests 4 --max-tokens 8 --shared-prefix 64
  --json "${out}/ch13_demo.json")
inferlab_cli_test(ch13_serve.DemoTakesNoPort PASS "--port has no use with demo" FAIL "Serving"
  COMMAND ch13_serve demo --port 8123)
inferlab_cli_test(ch13_serve.AMissingModelIsNamedBeforeListening PASS "/nonexistent/model" FAIL "serving .* on http"
  COMMAND ch13_serve --model /nonexistent/model --port 0)
inferlab_cli_test(ch13_serve.AMissingChatTemplateIsAUsageError PASS "--chat-template: cannot open chat template /nonexistent"
  FAIL "serving .* on http" COMMAND ch13_serve --chat-template /nonexistent/t.jinja --port 0)
inferlab_cli_test(ch13_serve.AMistypedFlagIsRefused PASS "--max-num-seq" FAIL "serving .* on http"
  COMMAND ch13_serve --max-num-seq 4 --port 0)
# --host 256.1.1.1 and nonexistent.invalid used to say "No such file or directory (is another
# server on that port?)": a stale errno and a wrong hint.
inferlab_cli_test(ch13_serve.AnInvalidIPv4HostIsNamed PASS "--host '256.1.1.1' is not a valid IPv4 address"
  FAIL "serving .* on http|another server" COMMAND ch13_serve --host 256.1.1.1 --port 0)
inferlab_cli_test(ch13_serve.AHostThatDoesNotResolveIsNamed PASS "cannot resolve --host 'nonexistent.invalid'"
  FAIL "serving .* on http|another server" COMMAND ch13_serve --host nonexistent.invalid --port 0)
inferlab_cli_test(ch13_serve.AnAddressOfAnotherMachineIsNamed PASS "'192.0.2.1' is not an address of this machine"
  FAIL "serving .* on http" COMMAND ch13_serve --host 192.0.2.1 --port 0)
# A --chat-template that cannot be parsed, or is not UTF-8, used to start a server whose every
# chat said "this model has no chat template": the operator asked for that file.
file(WRITE "${out}/macro.jinja" "{{ bos_token }}\n{% macro greet(name) %}hi {{ name }}{% endmacro %}")
inferlab_cli_test(ch13_serve.AChatTemplateThatCannotBeParsedStopsTheStart PASS "macro.jinja: line 2: .*macro"
  FAIL "serving .* on http" COMMAND ch13_serve --chat-template "${out}/macro.jinja" --port 0)
string(ASCII 233 latin1_e)
file(WRITE "${out}/latin1.jinja" "{{ 'caf${latin1_e}' }}")
inferlab_cli_test(ch13_serve.AChatTemplateThatIsNotUtf8StopsTheStart
  PASS "latin1.jinja: the chat template: not valid UTF-8" FAIL "serving .* on http|tokenizer input"
  COMMAND ch13_serve --chat-template "${out}/latin1.jinja" --port 0)
inferlab_cli_test(ch13_serve.ALimitOutOfRangeIsRefused PASS "--max-connections: 0 is outside" FAIL "serving .* on http"
  COMMAND ch13_serve --max-connections 0 --port 0)

# A GGUF given to a chapter that does not run its architecture names the chapter that does.
inferlab_cli_test(ch04_mla.AGgufOfAnotherArchitectureNamesItsChapter
  PASS "architecture 'llama' is not deepseek2, the GGUF architecture chapter 04 runs \\(it runs in chapter 09, ch09_quantization run FILE.gguf\\)"
  COMMAND ch04_mla generate --model "${PROJECT_SOURCE_DIR}/data/golden/moe-random/mixtral/model.gguf")
inferlab_cli_test(ch09_quantization.ADeepseek2GgufNamesChapter04
  PASS "architecture 'deepseek2' is not llama, qwen2, qwen2moe, qwen3, gemma2 or gemma3 \\(it runs in chapter 04, ch04_mla generate --model FILE.gguf\\)"
  COMMAND ch09_quantization run "${PROJECT_SOURCE_DIR}/data/golden/moe-random/deepseek-v3-noaux/model.gguf")
