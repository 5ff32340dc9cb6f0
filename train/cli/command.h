// One `roformer <command>`: a class per command, one file per command
// (train/cli/cmd_<name>.cpp), registered with ROFORMER_REGISTER_COMMAND.
//
//   class PretrainCommand : public roformer::cli::Command {
//    public:
//     std::string name() const override { return "pretrain"; }
//     std::string description() const override { return "Pretrain with masked-LM"; }
//     void setup(CLI::App& app) override { app.add_flag("--dry-run", dry_run_); }
//     int run(const roformer::cli::Invocation& inv) override { ... return 0; }
//    private:
//     bool dry_run_ = false;
//   };
//   ROFORMER_REGISTER_COMMAND(PretrainCommand)
//
// main.cpp adds --config FILE, --print-config and the trailing key=value
// overrides to every command whose config_use() is not kNone, loads and
// validates the config, handles --print-config, and only then calls run().
// Commands throw roformer::InputError for bad input; main.cpp alone turns
// exceptions into exit codes.
#pragma once

#include <CLI/CLI.hpp>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "train/config.h"

namespace roformer::cli {

enum class ConfigMode {
  kNone,      // the command takes no --config
  kOptional,  // e.g. predict/inspect, which can read the config from a checkpoint
  kRequired,
};

// What main hands to Command::run.
struct Invocation {
  // Loaded from --config with the overrides applied and validated; empty when
  // --config was not given (only possible with ConfigMode::kOptional).
  std::optional<Config> config;
  std::filesystem::path config_path;
  // The raw key=value overrides. Already applied when `config` is set; a
  // kOptional command that builds its config elsewhere (e.g. from a
  // checkpoint with parse_config_string) must apply or reject them itself.
  std::vector<std::string> overrides;
};

class Command {
 public:
  virtual ~Command() = default;
  virtual std::string name() const = 0;
  virtual std::string description() const = 0;
  virtual ConfigMode config_mode() const { return ConfigMode::kRequired; }
  // Declares the command's own options, bound to members of this object.
  virtual void setup(CLI::App& app) = 0;
  // Runs after parsing; returns the exit code (0 on success).
  virtual int run(const Invocation& invocation) = 0;
};

using CommandFactory = std::function<std::unique_ptr<Command>()>;

// Adds a command to the registry; returns true so it can initialise a static.
bool register_command(CommandFactory factory);
// One instance of every registered command, in the order of the README
// (prepare, tokenize, pretrain, finetune, evaluate, predict, convert, bench,
// inspect, config), then any others by name.
std::vector<std::unique_ptr<Command>> make_registered_commands();

}  // namespace roformer::cli

// Registers `Type` (default-constructible, derived from Command) from its own
// .cpp file; the executable links every cmd_*.cpp object, so nothing is lost.
#define ROFORMER_REGISTER_COMMAND(Type)                                           \
  namespace {                                                                     \
  [[maybe_unused]] const bool roformer_registered_command_##Type =                \
      ::roformer::cli::register_command([] { return std::make_unique<Type>(); }); \
  }
