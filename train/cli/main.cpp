// The `roformer` executable: parses the command line, loads the config for
// the chosen command, and is the only place that turns errors into exit codes
// (0 success, 1 internal/runtime failure, 2 bad input or bad command line).
#include <fmt/format.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <new>

#include "core/error.h"
#include "train/cli/command.h"
#include "train/config.h"
#include "train/config_stages.h"

#ifndef ROFORMER_VERSION
#define ROFORMER_VERSION "unknown"
#endif

namespace {

using roformer::cli::Command;
using roformer::cli::ConfigMode;

// The options main.cpp adds to every command that takes a config.
struct ConfigOptions {
  std::string path;
  bool print_config = false;
  std::vector<std::string> overrides;
};

void setup_logging(const std::string& level) {
  // Logs go to stderr so stdout stays clean for output such as --print-config.
  auto logger = spdlog::stderr_color_mt("roformer");
  logger->set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
  logger->set_level(spdlog::level::from_str(level));
  spdlog::set_default_logger(logger);
}

// CLI11 reports an unknown command as "a subcommand is required"; name it
// instead, with the commands this build has.
void check_command_name(int argc, char** argv,
                        const std::vector<std::unique_ptr<Command>>& commands) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--log-level") {
      ++i;  // skip its value
      continue;
    }
    if (arg.empty() || arg[0] == '-') continue;
    std::string names;
    for (const auto& command : commands) {
      if (command->name() == arg) return;
      names += (names.empty() ? "" : ", ") + command->name();
    }
    throw roformer::InputError(fmt::format(
        "unknown command '{}' (commands in this build: {}); run 'roformer --help'", arg, names));
  }
}

// Output that did not reach stdout (a full disk, /dev/full, a closed pipe) is a
// failure, not a success with exit code 0.
void check_stdout() {
  std::cout.flush();
  errno = 0;
  const bool flushed = std::fflush(stdout) == 0;
  if (!std::cout.good() || !flushed || std::ferror(stdout)) {
    const int err = errno;
    throw roformer::Error(fmt::format("cannot write to standard output{}",
                                      err ? std::string(": ") + std::strerror(err) : ""));
  }
}

int run_main(int argc, char** argv) {
  CLI::App app{
      "roformer: pretrain RoFormer (BERT with rotary position embedding) with masked-"
      "language modelling and fine-tune it.",
      "roformer"};
  app.set_version_flag("--version", "roformer " ROFORMER_VERSION);
  app.require_subcommand(1);
  app.fallthrough();  // global options may also follow the command name
  app.footer(
      "Run 'roformer <command> --help' for a command's options. Commands that take --config "
      "accept trailing key=value overrides (optim.lr=3e-4 stages.0.steps=10); config keys are "
      "documented in docs/config.md.\n");
  std::vector<CLI::App*> subcommands;
  app.failure_message([&subcommands](const CLI::App*, const CLI::Error& e) {
    std::string help = "roformer --help";
    for (const CLI::App* sub : subcommands)
      if (sub->parsed()) help = "roformer " + sub->get_name() + " --help";
    return fmt::format("roformer: error: {}\nRun '{}' for usage.\n", e.what(), help);
  });
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "Log verbosity")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}))
      ->capture_default_str();

  auto commands = roformer::cli::make_registered_commands();
  check_command_name(argc, argv, commands);
  std::vector<ConfigOptions> options(commands.size());
  for (size_t i = 0; i < commands.size(); ++i) {
    Command& command = *commands[i];
    CLI::App* sub = app.add_subcommand(command.name(), command.description());
    command.setup(*sub);
    if (command.config_mode() != ConfigMode::kNone) {
      CLI::Option* config =
          sub->add_option("--config", options[i].path, "YAML config file (see docs/config.md)")
              ->type_name("FILE");
      if (command.config_mode() == ConfigMode::kRequired) config->required();
      sub->add_flag("--print-config", options[i].print_config,
                    "Print the resolved config (defaults filled in, overrides applied) as YAML "
                    "and exit");
      sub->add_option("overrides", options[i].overrides,
                      "Config overrides, e.g. optim.lr=3e-4 stages.0.steps=10")
          ->type_name("KEY=VALUE");
    }
    subcommands.push_back(sub);
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version arrive here too, with exit code 0.
    return app.exit(e) == 0 ? 0 : 2;
  }

  setup_logging(log_level);
  for (size_t i = 0; i < commands.size(); ++i) {
    if (!subcommands[i]->parsed()) continue;
    Command& command = *commands[i];
    const ConfigOptions& opts = options[i];
    roformer::cli::Invocation invocation;
    invocation.overrides = opts.overrides;
    if (!opts.path.empty()) {
      invocation.config_path = opts.path;
      invocation.config = roformer::load_config(opts.path, opts.overrides);
      spdlog::debug("loaded config {} with {} override(s)", opts.path, opts.overrides.size());
    }
    if (opts.print_config) {
      if (!invocation.config)
        throw roformer::InputError(
            fmt::format("{}: --print-config needs --config FILE", command.name()));
      std::cout << roformer::to_yaml(*invocation.config);
      if (!invocation.config->stages.empty())
        std::cout << roformer::describe_stages_as_comments(*invocation.config);
      std::cout << std::flush;
      check_stdout();
      return 0;
    }
    const int code = command.run(invocation);
    check_stdout();
    return code;
  }
  return 2;  // unreachable: require_subcommand(1) guarantees a command
}

// Reports an error on stderr; stdout may be the broken stream, so its flush is
// attempted but not required.
void report(const char* kind, const std::string& message) {
  try {
    std::cout.flush();
  } catch (...) {
  }
  std::cout.clear();
  fmt::print(stderr, "roformer: {}{}\n", kind, message);
}

}  // namespace

int main(int argc, char** argv) {
  // No exception may reach std::terminate: every kind is reported here.
  try {
    return run_main(argc, argv);
  } catch (const roformer::InputError& e) {
    report("error: ", e.what());
    return 2;
  } catch (const roformer::Error& e) {
    report("error: ", e.what());
    return 1;
  } catch (const std::filesystem::filesystem_error& e) {
    // e.g. an unwritable run directory: name the path and the reason, not
    // "internal error: filesystem error".
    // what() reads "filesystem error: <operation>: <reason> [path]".
    std::string operation = e.what();
    if (operation.rfind("filesystem error: ", 0) == 0) operation.erase(0, 18);
    operation = operation.substr(0, operation.find(": "));
    std::string paths = e.path1().string();
    if (!e.path2().empty()) paths += "' to '" + e.path2().string();
    report("error: ", fmt::format("{} '{}': {}", operation, paths, e.code().message()));
    return 1;
  } catch (const std::bad_alloc&) {
    report("error: ",
           "out of memory (the model, batch or input is larger than this machine can hold; "
           "see docs/robustness.md)");
    return 1;
  } catch (const std::exception& e) {
    report("internal error: ", e.what());
    return 1;
  } catch (...) {
    report("internal error: ", "unknown exception");
    return 1;
  }
}
