// safetensors: files written by the Python `safetensors` package, files built byte by byte,
// our own writer, sharded checkpoints, and every kind of broken file.
#include <unistd.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <csignal>
#include <cstring>
#include <fstream>

#include "common/atomic_file.h"
#include "common/eval.h"
#include "common/gguf.h"
#include "common/hf_config.h"
#include "common/json_file.h"
#include "common/llama2c.h"
#include "common/safetensors.h"
#include "test_util.h"

namespace inferlab {
namespace {

using test::expect_error;
const std::string kGolden = std::string(INFERLAB_DATA_DIR) + "/golden/core";

// A safetensors file from a header string and raw data bytes.
std::string make_file(const std::string& header, const std::string& data) {
  std::string s(8, '\0');
  const std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(n >> (8 * i));
  return s + header + data;
}

std::string floats(std::initializer_list<float> v) {
  std::string s(v.size() * 4, '\0');
  std::memcpy(s.data(), std::data(v), s.size());
  return s;
}

TEST(Safetensors, ReadsWhatThePythonLibraryWrote) {
  SafetensorsFile f(kGolden + "/reference.safetensors");
  const auto ref = load_json(kGolden + "/reference.json");
  EXPECT_EQ(f.metadata().at("format"), "np");
  for (const auto& [name, want] : ref["tensors"].items()) {
    SCOPED_TRACE(name);
    Tensor t = f.get(name);
    EXPECT_EQ(t.shape(), want["shape"].get<Shape>());
    const auto got = t.to_double_vector();
    const auto values = want["values"].get<std::vector<double>>();
    ASSERT_EQ(got.size(), values.size());
    for (std::size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], values[i]) << "element " << i;
  }
  EXPECT_EQ(f.info("f16").dtype, DType::F16);
  EXPECT_EQ(f.info("i64").dtype, DType::I64);
}

TEST(Safetensors, ReadsAHandBuiltFile) {
  test::TempDir dir;
  const std::string header = R"({"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},)"
                             R"("a":{"dtype":"BF16","shape":[1,2],"data_offsets":[0,4]},"__metadata__":{"k":"v"}})";
  std::string data = floats({0.0f, 0.0f, 1.5f, -2.0f});
  const std::uint16_t bf[2] = {0x3F80, 0xC040};  // 1.0, -3.0
  std::memcpy(data.data(), bf, 4);
  test::write_file(dir.file("x.safetensors"), make_file(header, data));
  SafetensorsFile f(dir.file("x.safetensors"));
  EXPECT_EQ(f.names(), (std::vector<std::string>{"a", "b"}));  // in data order
  EXPECT_EQ(f.get("b").to_float_vector(), (std::vector<float>{1.5f, -2.0f}));
  EXPECT_EQ(f.get("a").to_float_vector(), (std::vector<float>{1.0f, -3.0f}));
  EXPECT_EQ(f.metadata().at("k"), "v");
}

// Every writer goes through AtomicFile: a writer that fails halfway leaves neither its target nor
// a temporary file.
TEST(AtomicFile, AWriterThatThrowsHalfwayLeavesNothing) {
  test::TempDir dir;
  const std::string path = dir.file("out.bin");
  expect_error(
      [&] {
    AtomicFile f(path);
    f.write("the first half");
    fail("the writer failed halfway");
      },
      {"halfway"});
  EXPECT_TRUE(test::list_folder(dir.path().string()).empty());
  write_file_atomically(path, "complete");
  EXPECT_EQ(test::read_file(path), "complete");
  EXPECT_EQ(test::list_folder(dir.path().string()), std::vector<std::string>{"out.bin"});
  expect_error([&] { write_file_atomically(dir.file("no/such/folder"), "x"); }, {"cannot write", "no/such/folder"});
}

// A target that is not a regular file is refused before anything is opened or created: renaming
// onto /dev/null replaced it with a regular file (the campaign did that to a machine's /dev/full).
TEST(AtomicFile, ATargetThatIsNotARegularFileIsRefusedBeforeAnythingIsCreated) {
  struct stat before {};
  ASSERT_EQ(::stat("/dev/null", &before), 0);
  ASSERT_TRUE(S_ISCHR(before.st_mode));
  expect_error([] { AtomicFile f("/dev/null"); }, {"cannot write /dev/null", "it is a character device"});
  expect_error([] { write_file_atomically("/dev/null", "x"); }, {"/dev/null", "not a regular file"});
  EXPECT_EQ(unwritable_file_reason("/dev/null"), "it is a character device, not a regular file");
  struct stat after {};
  ASSERT_EQ(::stat("/dev/null", &after), 0);
  EXPECT_TRUE(S_ISCHR(after.st_mode));
  EXPECT_EQ(after.st_rdev, before.st_rdev);
  test::TempDir dir;
  const std::string fifo = dir.file("pipe"), link = dir.file("link");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::filesystem::create_symlink(fifo, link);
  expect_error([&] { write_file_atomically(fifo, "x"); }, {fifo, "FIFO (named pipe), not a regular file"});
  expect_error([&] { write_file_atomically(link, "x"); }, {link, "FIFO"});  // through a link, the FIFO it names
  EXPECT_EQ(test::list_folder(dir.path().string()), (std::vector<std::string>{"link", "pipe"}));
  struct stat st {};
  ASSERT_EQ(::stat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
}

// A writer killed by SIGTERM or SIGINT mid-write leaves no temporary file: the handler installed
// with the first AtomicFile removes it and the signal then ends the process as it would have.
TEST(AtomicFile, ASignalMidWriteLeavesNoTemporaryFile) {
  for (int sig : {SIGTERM, SIGINT}) {
    test::TempDir dir;
    const std::string path = dir.file("out.bin");
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      AtomicFile f(path);
      f.write("the first half");
      ::raise(sig);
      ::_exit(3);  // not reached
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == sig) << "status " << status;
    EXPECT_TRUE(test::list_folder(dir.path().string()).empty()) << "signal " << sig;
  }
}

// save_safetensors used to truncate the old file first, then fail partway through the new one.
TEST(Safetensors, AFailedWriteKeepsTheOldFileAndLeavesNoOther) {
  test::TempDir dir;
  const std::string path = dir.file("m.safetensors");
  save_safetensors(path, {{"small", Tensor::zeros({4}, DType::F32)}});
  const std::string before = test::read_file(path);
  {
    test::FileSizeLimit limit(4096);  // the new file needs 16 KiB
    expect_error([&] { save_safetensors(path, {{"big", Tensor::zeros({64, 64}, DType::F32)}}); }, {"error writing", path});
  }
  EXPECT_EQ(test::read_file(path), before);
  EXPECT_EQ(test::list_folder(dir.path().string()), std::vector<std::string>{"m.safetensors"});
  EXPECT_EQ(SafetensorsFile(path).names(), std::vector<std::string>{"small"});
}

TEST(Safetensors, WriterRoundTripsEveryDtype) {
  test::TempDir dir;
  auto rng = test::rng_for_test();
  std::vector<std::pair<std::string, Tensor>> ts;
  for (DType d : {DType::F32, DType::F16, DType::BF16})
    ts.emplace_back(std::string(dtype_name(d)), test::uniform_as(rng, {3, 5}, d));
  ts.emplace_back("ids", Tensor::from_vector(std::vector<std::int32_t>{4, -1, 7}, {3}));
  ts.emplace_back("big", Tensor::from_vector(std::vector<std::int64_t>{1ll << 40}, {1}));
  ts.emplace_back("strided", test::uniform(rng, {4, 6}).slice(1, 2, 5));
  save_safetensors(dir.file("rt.safetensors"), ts, {{"who", "test"}});
  SafetensorsFile f(dir.file("rt.safetensors"));
  EXPECT_EQ(f.metadata().at("who"), "test");
  for (const auto& [name, t] : ts) {
    Tensor r = f.get(name);
    EXPECT_EQ(r.dtype(), t.dtype()) << name;
    EXPECT_EQ(r.shape(), t.shape()) << name;
    EXPECT_EQ(r.to_double_vector(), t.to_double_vector()) << name;
  }
}

TEST(Checkpoint, ShardedFolderThroughItsIndex) {
  Checkpoint c(kGolden + "/sharded");
  EXPECT_EQ(c.names(), (std::vector<std::string>{"lm_head.weight", "model.embed.weight", "model.norm.weight"}));
  EXPECT_EQ(c.get("model.embed.weight", {4, 2}).to_float_vector()[7], 7.0f);
  EXPECT_EQ(c.get("model.norm.weight").dtype(), DType::F16);
  expect_error([&] { c.get("model.embed.weight", {2, 4}); }, {"model.embed.weight", "[4, 2]", "expected [2, 4]"});
  expect_error([&] { c.get("nope"); }, {"no tensor 'nope'"});
}

TEST(Checkpoint, BrokenIndexAndMissingFiles) {
  test::TempDir dir;
  expect_error([&] { Checkpoint(dir.file("absent")); }, {"absent", "no such file"});
  expect_error([&] { Checkpoint c(dir.path().string()); }, {"no model.safetensors"});
  test::write_file(dir.file("model.safetensors.index.json"), R"({"weight_map": {"w": "shard.safetensors"}})");
  expect_error([&] { Checkpoint c(dir.path().string()); }, {"shard.safetensors"});
  test::write_file(dir.file("shard.safetensors"),
                   make_file(R"({"v":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", floats({1.0f})));
  expect_error([&] { Checkpoint c(dir.path().string()); }, {"weight_map puts 'w'", "no such tensor"});
  test::write_file(dir.file("model.safetensors.index.json"), R"({"metadata": {}})");
  expect_error([&] { Checkpoint c(dir.path().string()); }, {"model.safetensors.index.json", "weight_map"});
  test::write_file(dir.file("model.safetensors.index.json"), R"({"weight_map": )");
  expect_error([&] { Checkpoint c(dir.path().string()); }, {"model.safetensors.index.json", "not valid JSON"});
}

struct Broken {
  const char* name;
  std::string bytes;
  std::vector<std::string> message;
};

TEST(Safetensors, MalformedFilesNameTheFileAndTheField) {
  const std::string ok_entry = R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::string data = floats({1.0f, 2.0f});
  std::string long_header = make_file("{" + ok_entry + "}", data);
  long_header[0] = static_cast<char>(0xFF);  // header length far past the end
  const std::vector<Broken> cases = {
      {"empty", "", {"too short"}},
      {"short", "abc", {"too short"}},
      {"header past end", long_header, {"header length", "runs past the end"}},
      {"truncated data",
       make_file("{" + ok_entry + "}", data.substr(0, 5)),
       {"tensor 'w'", "data_offsets end 8", "truncated"}},
      {"bad json", make_file(R"({"w": {"dtype": )", data), {"not valid JSON"}},
      {"not an object", make_file("[1, 2]", data), {"JSON object"}},
      {"missing dtype", make_file(R"({"w":{"shape":[2],"data_offsets":[0,8]}})", data), {"tensor 'w'", "'dtype'"}},
      {"missing shape", make_file(R"({"w":{"dtype":"F32","data_offsets":[0,8]}})", data), {"tensor 'w'", "'shape'"}},
      {"missing offsets", make_file(R"({"w":{"dtype":"F32","shape":[2]}})", data), {"tensor 'w'", "'data_offsets'"}},
      // Present but of the wrong type: named with the value, not called missing.
      {"dtype a number",
       make_file(R"({"w":{"dtype":5,"shape":[2],"data_offsets":[0,8]}})", data),
       {"tensor 'w'", "field 'dtype' must be a string, got 5"}},
      {"shape a string",
       make_file(R"({"w":{"dtype":"F32","shape":"2","data_offsets":[0,8]}})", data),
       {"tensor 'w'", "field 'shape' must be a list, got \"2\""}},
      {"three offsets",
       make_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4,8]}})", data),
       {"tensor 'w'", "field 'data_offsets' must be [begin, end], got [0,4,8]"}},
      {"unknown dtype",
       make_file(R"({"w":{"dtype":"I16","shape":[4],"data_offsets":[0,8]}})", data),
       {"tensor 'w'", "dtype 'I16' is not supported"}},
      {"wrong byte count",
       make_file(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", data),
       {"tensor 'w'", "hold 8 bytes", "needs 12"}},
      {"negative shape",
       make_file(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", data),
       {"tensor 'w'", "'shape'"}},
      {"huge dimension",
       make_file(R"({"w":{"dtype":"F32","shape":[18446744073709551615,2],"data_offsets":[0,8]}})", data),
       {"tensor 'w'", "64-bit integers", "18446744073709551615"}},
      {"overflowing size",
       make_file(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", data),
       {"tensor 'w'", "overflows 64 bits"}},
      {"backwards", make_file(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})", data), {"run backwards"}},
      {"overlap",
       make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                 R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                 data),
       {"'a' and 'b' overlap"}},
      {"bad metadata", make_file(R"({"__metadata__":{"x":1},)" + ok_entry + "}", data), {"__metadata__", "'x'"}},
  };
  test::TempDir dir;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = dir.file("broken.safetensors");
    test::write_file(path, c.bytes);
    try {
      SafetensorsFile f(path);
      ADD_FAILURE() << "opened a broken file";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(path), std::string::npos) << msg;  // names the file
      for (const auto& part : c.message) EXPECT_NE(msg.find(part), std::string::npos) << msg;
    }
  }
  expect_error([&] { SafetensorsFile f(dir.file("missing.safetensors")); }, {"cannot open", "missing.safetensors"});
}

TEST(InputFiles, EveryReaderRefusesAFifoBeforeOpeningIt) {
  // Opening a FIFO blocks until something writes to it: each of these used to hang.
  test::TempDir dir;
  test::expect_fifo_refused(dir.file("model.safetensors"), [](const std::string& p) { SafetensorsFile f(p); });
  test::expect_fifo_refused(dir.file("model.gguf"), [](const std::string& p) { gguf::File f(p); });
  test::expect_fifo_refused(dir.file("model.bin"), [](const std::string& p) { load_llama2c(p); });
  test::expect_fifo_refused(dir.file("tokenizer.bin"), [](const std::string& p) { Llama2cTokenizer::load(p); });
  test::expect_fifo_refused(dir.file("index.json"), [](const std::string& p) { load_json(p); });
  test::expect_fifo_refused(dir.file("probes.jsonl"), [](const std::string& p) { eval::load_probes(p); });
  const auto tok = HfTokenizer::load(std::string(INFERLAB_DATA_DIR) + "/models/tiny-mha");
  test::expect_fifo_refused(dir.file("val.txt"), [&](const std::string& p) { eval::tokenize_documents(tok, p); });
  // A folder whose model.safetensors or config.json is a FIFO or a directory.
  test::TempDir model;
  test::expect_fifo_refused(model.file("model.safetensors"), [&](const std::string&) { Checkpoint c(model.path()); });
  test::expect_fifo_refused(model.file("config.json"), [&](const std::string&) { load_hf_config(model.path()); });
  test::TempDir folders;
  std::filesystem::create_directories(folders.file("config.json"));
  expect_error([&] { load_hf_config(folders.path()); }, {"config.json", "a directory, not a regular file"});
}

}  // namespace
}  // namespace inferlab
