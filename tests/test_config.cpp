// train_gpt's settings (examples/common/train_config.h): the JSON config file over
// the defaults, one table of keys shared with the command-line flags, and errors
// that name the file and the key.
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "test_helpers.h"
#include "train_config.h"

using namespace dtensor::tools;

namespace {

std::string write_temp(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "dtensor_config_" + std::to_string(::getpid()) + "_" + name;
  std::ofstream(path) << text;
  return path;
}

// train_gpt's command line `args` (without the program name).
std::optional<TrainConfig> parse_args(const std::vector<std::string>& args) {
  std::vector<const char*> argv = {"train_gpt"};
  for (const std::string& a : args) argv.push_back(a.c_str());
  return parse_train_args(static_cast<int>(argv.size()), argv.data());
}

}  // namespace

TEST(TrainConfig, FileValuesOverTheDefaults) {
  const TrainConfig c = parse_train_config(R"({"steps": 100, "lr": 2e-3, "warmup": 1e1, "precision": "bf16",
                                               "hsdp": true, "mesh": "dp=2,tp=2", "dropout": 0})",
                                           "cfg.json");
  EXPECT_EQ(c.steps, 100);
  EXPECT_DOUBLE_EQ(c.lr, 0.002);
  EXPECT_EQ(c.warmup, 10);  // a whole number written with an exponent is an integer
  EXPECT_EQ(c.precision, "bf16");
  EXPECT_TRUE(c.hsdp);
  EXPECT_EQ(c.mesh, "dp=2,tp=2");
  EXPECT_EQ(c.dropout, 0.0);                // an integer is a number
  EXPECT_EQ(c.batch, TrainConfig{}.batch);  // absent keys keep the default
  TrainConfig base;
  base.batch = 64;
  EXPECT_EQ(parse_train_config("{}", "empty.json", base).batch, 64);  // and a given base
}

TEST(TrainConfig, ErrorsNameTheFileAndTheKey) {
  EXPECT_THROW_MSG(parse_train_config(R"({"steps": 10, "stpes": 20})", "cfg.json"), std::invalid_argument,
                   "[config] cfg.json: unknown key \"stpes\"");
  EXPECT_THROW_MSG(parse_train_config(R"({"config": "other.json"})", "cfg.json"), std::invalid_argument,
                   "unknown key \"config\"");  // a config does not include another
  EXPECT_THROW_MSG(parse_train_config(R"({"steps": "ten"})", "cfg.json"), std::invalid_argument,
                   "[config] cfg.json: key \"steps\": expected an integer, got \"ten\"");
  EXPECT_THROW_MSG(parse_train_config(R"({"steps": 2.5})", "c.json"), std::invalid_argument,
                   "key \"steps\": expected an integer, got 2.5");
  EXPECT_THROW_MSG(parse_train_config(R"({"steps": 18446744073709551615})", "c.json"), std::invalid_argument,
                   "key \"steps\": expected a 64-bit integer");
  EXPECT_THROW_MSG(parse_train_config(R"({"lr": "fast"})", "c.json"), std::invalid_argument,
                   "key \"lr\": expected a number, got \"fast\"");
  EXPECT_THROW_MSG(parse_train_config(R"({"hsdp": 1})", "c.json"), std::invalid_argument,
                   "key \"hsdp\": expected true or false, got 1");
  EXPECT_THROW_MSG(parse_train_config(R"({"mesh": 2})", "c.json"), std::invalid_argument,
                   "key \"mesh\": expected a string, got 2");
  EXPECT_THROW_MSG(parse_train_config(R"({"precision": "fp8"})", "c.json"), std::invalid_argument,
                   "key \"precision\": expected one of fp32, bf16, fp16, got \"fp8\"");
  EXPECT_THROW_MSG(parse_train_config(R"({"steps": 1, "steps": 2})", "c.json"), std::invalid_argument,
                   "[config] c.json: key \"steps\" given twice");
  EXPECT_THROW_MSG(parse_train_config("[1, 2]", "c.json"), std::invalid_argument,
                   "[config] c.json: expected a JSON object of keys, got an array");
}

TEST(TrainConfig, SyntaxErrorsNameLineAndColumn) {
  EXPECT_THROW_MSG(parse_train_config("{\n  \"steps\": 1,\n  \"batch\" 2\n}", "cfg.json"), std::invalid_argument,
                   "[config] cfg.json:3:11: syntax error");
  EXPECT_THROW_MSG(parse_train_config("{\"steps\": tru}", "cfg.json"), std::invalid_argument, "cfg.json:1:14:");
  EXPECT_THROW_MSG(parse_train_config("", "empty.json"), std::invalid_argument, "[config] empty.json:1:1:");
  EXPECT_THROW_MSG(parse_train_config("{} x", "c.json"), std::invalid_argument, "c.json:1:4:");
  EXPECT_THROW_MSG(parse_train_config("{\"mesh\": \"\xff\"}", "c.json"), std::invalid_argument, "c.json:1:");
  // Found by tests/fuzz/fuzz_config (its seed corpus): a number beyond a double's range
  // is nlohmann's out_of_range, not a parse error, and escaped the loader.
  EXPECT_THROW_MSG(parse_train_config("[5e1103]", "big.json"), std::invalid_argument,
                   "[config] big.json: number overflow parsing '5e1103' (a JSON number must fit a double)");
  EXPECT_THROW_MSG(parse_train_config("{\"lr\": -1e400}", "big.json"), std::invalid_argument, "number overflow");
  // Deep nesting is a syntax-free document of the wrong shape, not a stack overflow.
  EXPECT_THROW_MSG(parse_train_config(std::string(100000, '[') + std::string(100000, ']'), "deep.json"),
                   std::invalid_argument, "expected a JSON object of keys, got an array");
}

TEST(TrainConfig, FromFile) {
  const std::string path = write_temp("ok.json", "{\"layers\": 3, \"activation\": \"swiglu\"}\n");
  const TrainConfig c = load_train_config(path);
  EXPECT_EQ(c.layers, 3);
  EXPECT_EQ(c.activation, "swiglu");
  std::remove(path.c_str());
  const std::string bad = write_temp("bad.json", "{\n  \"layers\": 3,\n}\n");
  EXPECT_THROW_MSG(load_train_config(bad), std::invalid_argument, "[config] " + bad + ":3:1: syntax error");
  std::remove(bad.c_str());
  EXPECT_THROW_MSG(load_train_config("/nonexistent/c.json"), std::invalid_argument,
                   "[config] cannot read config file \"/nonexistent/c.json\"");
}

TEST(TrainConfig, EveryKeyIsAFlagAndAConfigKey) {
  // One table: each key parses from the command line and from a file to the same value.
  for (const TrainKey& key : train_keys()) {
    SCOPED_TRACE(key.name);
    std::string flag_value, json_value;
    std::visit(
        [&](auto member) {
          using T = std::remove_reference_t<decltype(TrainConfig{}.*member)>;
          if constexpr (std::is_same_v<T, std::string>) {
            flag_value = key.choices.empty() ? "x.txt" : key.choices.back();
            json_value = "\"" + flag_value + "\"";
          } else if constexpr (std::is_same_v<T, bool>) {
            // Off by default: a switch (--hsdp). On by default: it takes a value
            // (--tie-weights false).
            const bool on = TrainConfig{}.*member;
            json_value = on ? "false" : "true";
            if (on) flag_value = "false";
          } else {
            flag_value = json_value = "7";
          }
        },
        key.member);
    std::vector<std::string> args = {std::string("--") + key.name};
    if (!flag_value.empty()) args.push_back(flag_value);
    const std::optional<TrainConfig> from_flags = parse_args(args);
    ASSERT_TRUE(from_flags.has_value());
    const TrainConfig from_file =
        parse_train_config("{\"" + std::string(key.name) + "\": " + json_value + "}", "k.json");
    std::visit(
        [&](auto member) {
          EXPECT_EQ((*from_flags).*member, from_file.*member);
          EXPECT_NE(from_file.*member, TrainConfig{}.*member) << "the test value equals the default";
        },
        key.member);
  }
}

TEST(TrainConfig, FlagsWinOverTheConfigFile) {
  const std::string path = write_temp("base.json", R"({"steps": 100, "batch": 8, "precision": "fp16"})");
  const std::optional<TrainConfig> c = parse_args({"--steps", "5", "--config", path, "--precision=bf16", "--hsdp"});
  std::remove(path.c_str());
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->steps, 5);
  EXPECT_EQ(c->precision, "bf16");
  EXPECT_TRUE(c->hsdp);
  EXPECT_EQ(c->batch, 8);              // from the file
  EXPECT_EQ(c->lr, TrainConfig{}.lr);  // the default: neither gave it
  EXPECT_EQ(parse_args({})->steps, TrainConfig{}.steps);
}

TEST(TrainConfig, HelpListsEveryKeyWithItsDefault) {
  ::testing::internal::CaptureStdout();
  EXPECT_FALSE(parse_args({"--help"}).has_value());
  const std::string help = ::testing::internal::GetCapturedStdout();
  for (const TrainKey& key : train_keys())
    EXPECT_NE(help.find(std::string("--") + key.name), std::string::npos) << key.name;
  EXPECT_NE(help.find("--config"), std::string::npos);
  EXPECT_NE(help.find("200"), std::string::npos);  // the default of --steps
}

TEST(TrainConfig, BadFlagsAreOneLineErrors) {
  EXPECT_THROW_MSG(parse_args({"--steps", "abc"}), std::invalid_argument, "--steps");
  EXPECT_THROW_MSG(parse_args({"--steps", "abc"}), std::invalid_argument, "abc");
  EXPECT_THROW_MSG(parse_args({"--stpes", "3"}), std::invalid_argument, "unknown flag --stpes (see --help)");
  EXPECT_THROW_MSG(parse_args({"--stpes=3"}), std::invalid_argument, "unknown flag --stpes (see --help)");
  EXPECT_THROW_MSG(parse_args({"--steps", "3", "4"}), std::invalid_argument, "unexpected argument '4'");
  EXPECT_THROW_MSG(parse_args({"--log", "loud"}), std::invalid_argument, "loud");
  EXPECT_THROW_MSG(parse_args({"--steps"}), std::invalid_argument, "--steps");
  EXPECT_THROW_MSG(parse_args({"--config", "/nonexistent/c.json"}), std::invalid_argument,
                   "[config] cannot read config file \"/nonexistent/c.json\"");
  for (const std::vector<std::string>& bad : {std::vector<std::string>{"--steps", "abc"}, {"--stpes", "3"}}) {
    try {
      parse_args(bad);
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    }
  }
}
