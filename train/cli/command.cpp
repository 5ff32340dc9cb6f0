#include "train/cli/command.h"

#include <algorithm>
#include <array>
#include <string_view>

namespace roformer::cli {

namespace {

// A function-local static: registrations run during static initialisation of
// other translation units, in no particular order.
std::vector<CommandFactory>& registry() {
  static std::vector<CommandFactory> factories;
  return factories;
}

size_t canonical_rank(const std::string& name) {
  static constexpr std::array<std::string_view, 10> kOrder = {
      "prepare", "tokenize", "pretrain", "finetune", "evaluate",
      "predict", "convert",  "bench",    "inspect",  "config"};
  auto it = std::find(kOrder.begin(), kOrder.end(), name);
  return static_cast<size_t>(it - kOrder.begin());
}

}  // namespace

bool register_command(CommandFactory factory) {
  registry().push_back(std::move(factory));
  return true;
}

std::vector<std::unique_ptr<Command>> make_registered_commands() {
  std::vector<std::unique_ptr<Command>> commands;
  for (const auto& factory : registry()) commands.push_back(factory());
  std::sort(commands.begin(), commands.end(), [](const auto& a, const auto& b) {
    const size_t ra = canonical_rank(a->name()), rb = canonical_rank(b->name());
    return ra != rb ? ra < rb : a->name() < b->name();
  });
  return commands;
}

}  // namespace roformer::cli
