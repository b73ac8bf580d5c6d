// A model directory holding only config.json (for made-up weights), and the config as the engine
// reads it (max_positions: the model's max_position_embeddings).
#pragma once

#include <filesystem>
#include <fstream>
#include <string>

#include "model/model_config.h"

struct ConfigDir {
  std::string dir;
  revolta::ModelConfig config;
};

inline ConfigDir config_dir(const std::string& name, const std::string& json) {
  const auto dir = std::filesystem::temp_directory_path() / ("revolta-test-" + name);
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << json;
  revolta::ModelConfig c = revolta::ModelConfig::from_file((dir / "config.json").string());
  c.max_positions = c.max_position_embeddings;
  return {dir.string(), c};
}
