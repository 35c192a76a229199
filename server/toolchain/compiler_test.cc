#include "server/toolchain/compiler.h"

#include <dirent.h>
#include <dlfcn.h>
#include <stdlib.h>
#include <unistd.h>

#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/toolchain/subprocess.h"

namespace kiln::toolchain {
namespace {

constexpr char kTiny[] = "extern \"C\" int kiln_answer() { return 42; }\n";

// A private temp root per test, so that the test can check nothing is left behind.
class CompilerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* t = std::getenv("TEST_TMPDIR");
    std::string templ = absl::StrCat(t != nullptr ? t : "/tmp", "/root-XXXXXX");
    ASSERT_NE(mkdtemp(templ.data()), nullptr);
    root_ = templ;
    options_.temp_root = root_;
  }
  int EntriesInRoot() const {
    DIR* d = opendir(root_.c_str());
    int n = 0;
    while (dirent* e = readdir(d)) {
      if (std::string(e->d_name) != "." && std::string(e->d_name) != "..") ++n;
    }
    closedir(d);
    return n;
  }
  std::string root_;
  CompileOptions options_;
};

TEST(MarchTest, AcceptsPlainTokensOnly) {
  EXPECT_TRUE(ValidateMarch("x86-64-v3").ok());
  EXPECT_TRUE(ValidateMarch("armv8.2-a+fp16").ok());
  EXPECT_TRUE(ValidateMarch("").ok());
  EXPECT_EQ(ValidateMarch("native").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateMarch("x86-64 -o /etc/passwd").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateMarch("-fplugin=evil.so").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateMarch("X86").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateMarch("a;b").code(), absl::StatusCode::kInvalidArgument);
}

TEST(SubprocessTest, FindsProgramsAndRefusesUnknown) {
  EXPECT_TRUE(FindProgram("g++").ok());
  EXPECT_EQ(FindProgram("kiln-no-such-compiler").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SubprocessTest, AProcessSeenFinishedAfterItsDeadlineTimedOut) {
  // /bin/true is quick, but with no time at all it is only ever seen after the deadline: the
  // limit must not depend on how soon this thread is scheduled again.
  char dir[] = "/tmp/kiln-subprocess-test.XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  ProcessOptions options;
  options.output_path = std::string(dir) + "/out";
  options.timeout = absl::ZeroDuration();
  absl::StatusOr<ProcessResult> r = RunProcess({"/bin/true"}, options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->timed_out);
  EXPECT_FALSE(r->ok());
  options.timeout = absl::Seconds(30);
  r = RunProcess({"/bin/true"}, options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->ok());
  unlink(options.output_path.c_str());
  rmdir(dir);
}

TEST_F(CompilerTest, IdentityIsTheFirstVersionLine) {
  absl::StatusOr<std::string> id = CompilerIdentity("g++");
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_TRUE(absl::StartsWith(*id, "g++")) << *id;
  EXPECT_EQ(id->find('\n'), std::string::npos);
}

TEST_F(CompilerTest, CompilesToAnElfSharedObjectAndCleansUp) {
  options_.march = "x86-64-v2";
  absl::StatusOr<CompiledBinary> b = CompileSharedObject(kTiny, options_);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_GT(b->bytes.size(), 4u);
  EXPECT_EQ(b->bytes.substr(0, 4), "\x7f" "ELF");
  EXPECT_TRUE(absl::StartsWith(b->compiler_id, "g++"));
  EXPECT_NE(std::find(b->flags.begin(), b->flags.end(), "-march=x86-64-v2"), b->flags.end());
  EXPECT_EQ(std::find(b->flags.begin(), b->flags.end(), "-ffast-math"), b->flags.end());
  EXPECT_GT(b->timings.compile, absl::ZeroDuration());
  EXPECT_EQ(EntriesInRoot(), 0);
}

// Parts compile in parallel processes and link into one shared object holding every part's
// symbols; a part that fails is named in the error, and nothing is left behind either way.
TEST_F(CompilerTest, PartsCompileApartAndLinkIntoOneObject) {
  const std::vector<std::string> parts = {"extern \"C\" int kiln_part_a() { return 1; }\n",
                                          "extern \"C\" int kiln_part_b() { return 2; }\n",
                                          "extern \"C\" int kiln_part_c() { return 3; }\n"};
  absl::StatusOr<CompiledBinary> b = CompileSharedObject(absl::MakeConstSpan(parts), options_);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->bytes.substr(0, 4), "\x7f" "ELF");
  for (const char* symbol : {"kiln_part_a", "kiln_part_b", "kiln_part_c"}) {
    EXPECT_TRUE(absl::StrContains(b->bytes, symbol)) << symbol;
  }
  EXPECT_EQ(EntriesInRoot(), 0);

  const std::vector<std::string> bad = {parts[0], "int broken( {\n"};
  absl::StatusOr<CompiledBinary> e = CompileSharedObject(absl::MakeConstSpan(bad), options_);
  ASSERT_EQ(e.status().code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(absl::StrContains(e.status().message(), "part 1 of 2")) << e.status();
  EXPECT_TRUE(absl::StrContains(e.status().message(), "compiler log")) << e.status();
  EXPECT_EQ(EntriesInRoot(), 0);
}

// A prelude shared by the parts is precompiled once (a .gch in one private dir under the temp
// root, kept for the process) and gives the same symbols as the prelude pasted into each part.
TEST_F(CompilerTest, PreludeIsPrecompiledOnceAndUsedByEveryPart) {
  const std::string prelude = "#include <cstdint>\ninline int32_t kiln_twice(int32_t x) { return 2 * x; }\n";
  const std::vector<std::string> parts = {"extern \"C\" int kiln_p1() { return kiln_twice(1); }\n",
                                          "extern \"C\" int kiln_p2() { return kiln_twice(2); }\n"};
  for (int round = 0; round < 2; ++round) {
    absl::StatusOr<CompiledBinary> b = CompileSharedObject(prelude, absl::MakeConstSpan(parts), options_);
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_TRUE(absl::StrContains(b->bytes, "kiln_p1"));
    EXPECT_TRUE(absl::StrContains(b->bytes, "kiln_p2"));
    EXPECT_EQ(EntriesInRoot(), 1);  // the precompiled prelude's dir, built once
  }
  DIR* d = opendir(root_.c_str());
  std::string pch_dir;
  while (dirent* e = readdir(d)) {
    if (std::string(e->d_name) != "." && std::string(e->d_name) != "..") pch_dir = root_ + "/" + e->d_name;
  }
  closedir(d);
  EXPECT_EQ(access((pch_dir + "/kiln_prelude.h.gch").c_str(), R_OK), 0) << pch_dir;

  options_.precompiled_prelude = false;
  absl::StatusOr<CompiledBinary> pasted = CompileSharedObject(prelude, absl::MakeConstSpan(parts), options_);
  ASSERT_TRUE(pasted.ok()) << pasted.status();
  EXPECT_TRUE(absl::StrContains(pasted->bytes, "kiln_p2"));
  EXPECT_EQ(EntriesInRoot(), 1);
}

// g++ kernels are linked by `ld` with libgomp alone; one that calls into libm fails that link
// (-z defs) and is linked again by the driver. Both load and run.
TEST_F(CompilerTest, KernelsLinkWithLibgompAloneUnlessTheyCallLibm) {
  const std::string parallel =
      "extern \"C\" __attribute__((visibility(\"default\"))) double kiln_f(double x) {\n  double s = 0;\n#pragma omp parallel for reduction(+:s)\n"
      "  for (int i = 0; i < 1000; ++i) s += x;\n  return s;\n}\n";
  const std::string libm =
      "extern \"C\" __attribute__((visibility(\"default\"))) double kiln_f(double x) { return __builtin_fmod(x, 0.75) + __builtin_pow(x, x); }\n";
  struct Case {
    const std::string& source;
    bool direct;
    double want;
  };
  for (const Case& c : {Case{parallel, true, 2000.0}, Case{libm, false, 4.5}}) {
    absl::StatusOr<CompiledBinary> b = CompileSharedObject(c.source, options_);
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(b->direct_link, c.direct) << c.source;
    EXPECT_FALSE(absl::StrContains(b->log, "undefined reference")) << b->log;
    const std::string path = absl::StrCat(root_, "/k", c.direct, ".so");  // dlopen knows a path once
    {
      std::ofstream f(path, std::ios::binary);
      f.write(b->bytes.data(), static_cast<std::streamsize>(b->bytes.size()));
    }
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(handle, nullptr) << dlerror();
    auto* f = reinterpret_cast<double (*)(double)>(dlsym(handle, "kiln_f"));
    ASSERT_NE(f, nullptr);
    EXPECT_DOUBLE_EQ(f(2.0), c.want) << c.source;
    // No dlclose: it would unload libgomp (this test links none) under its idle worker threads.
    unlink(path.c_str());
  }
  EXPECT_EQ(EntriesInRoot(), 0);
}

TEST_F(CompilerTest, ClangCompilesToo) {
  if (!FindProgram("clang++-14").ok()) GTEST_SKIP() << "clang++-14 not installed";
  options_.compiler = "clang++-14";
  absl::StatusOr<CompiledBinary> b = CompileSharedObject(kTiny, options_);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->bytes.substr(0, 4), "\x7f" "ELF");
  EXPECT_TRUE(absl::StrContains(b->compiler_id, "clang")) << b->compiler_id;
}

TEST_F(CompilerTest, RefusesNativeBeforeRunningAnything) {
  options_.march = "native";
  EXPECT_EQ(CompileSharedObject(kTiny, options_).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(CompilerTest, InvalidSourceIsInternalWithTheLog) {
  absl::StatusOr<CompiledBinary> b =
      CompileSharedObject("int main( { this is not C++ }\n", options_);
  ASSERT_EQ(b.status().code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(absl::StrContains(b.status().message(), "error")) << b.status();
  EXPECT_TRUE(absl::StrContains(b.status().message(), "compiler log")) << b.status();
  EXPECT_EQ(EntriesInRoot(), 0);
}

TEST_F(CompilerTest, LogIsTruncatedToItsBound) {
  std::string src;
  for (int i = 0; i < 200; ++i) src += absl::StrCat("int f", i, "() { return undefined_", i, "; }\n");
  options_.max_log_bytes = 1000;
  absl::StatusOr<CompiledBinary> b = CompileSharedObject(src, options_);
  ASSERT_EQ(b.status().code(), absl::StatusCode::kInternal);
  EXPECT_LT(b.status().message().size(), 1400u);
  EXPECT_TRUE(absl::StrContains(b.status().message(), "[log truncated]"));
}

TEST_F(CompilerTest, TimeLimitKillsTheCompile) {
  // Heavy enough to take well over the budget: many template instantiations.
  std::string src = "#include <map>\n#include <string>\n#include <vector>\n";
  src += "template <int N> struct F { static long v() { return F<N - 1>::v() + N; } };\n";
  src += "template <> struct F<0> { static long v() { return 0; } };\n";
  src += "extern \"C\" long kiln_f() { return F<800>::v(); }\n";
  options_.timeout = absl::Milliseconds(30);
  const absl::Time start = absl::Now();
  absl::StatusOr<CompiledBinary> b = CompileSharedObject(src, options_);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kDeadlineExceeded) << b.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(EntriesInRoot(), 0);
}

TEST_F(CompilerTest, MemoryLimitIsApplied) {
  options_.memory_limit_bytes = int64_t{48} << 20;
  absl::StatusOr<CompiledBinary> b =
      CompileSharedObject("#include <cmath>\n#include <vector>\n" + std::string(kTiny), options_);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted) << b.status();
  // g++ words it "out of memory allocating ..." or "virtual memory exhausted", depending on where it fails.
  EXPECT_TRUE(absl::StrContains(b.status().message(), "memory limit of")) << b.status();
  EXPECT_EQ(EntriesInRoot(), 0);
}

TEST_F(CompilerTest, PoolBoundsConcurrentCompiles) {
  CompilePool pool(2);
  std::vector<std::thread> threads;
  std::vector<absl::Status> results(4);
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      results[i] = pool.Compile(absl::StrCat(kTiny, "int g", i, ";\n"), options_).status();
      EXPECT_LE(pool.in_flight(), 2);
    });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(pool.in_flight(), 0);
}

}  // namespace
}  // namespace kiln::toolchain
