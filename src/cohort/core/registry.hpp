// defines: Registry
//
// Names to factories, open to the program: Cohort registers its own tasks
// and models, and a program built on the library adds more (before it
// parses a config) with register_task / register_image_model. One template
// serves every registry, so lookups fail the same way everywhere.
#pragma once

#include <initializer_list>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "cohort/core/error.hpp"

namespace cohort {

template <class Factory>
class Registry {
 public:
  // `key` is the config key that names an entry ("train.task"), for errors;
  // `built_in` the entries the library itself provides.
  Registry(std::string key, std::initializer_list<std::pair<const std::string, Factory>> built_in)
      : key_(std::move(key)), entries_(built_in) {}

  // Adds `name`. A name registered twice is a UsageError: two parts of a
  // program would silently disagree about what it means.
  void add(const std::string& name, Factory factory) {
    std::lock_guard<std::mutex> lock(mutex_);
    COHORT_CHECK(!name.empty(), UsageError, key_, ": cannot register an empty name");
    COHORT_CHECK(static_cast<bool>(factory), UsageError, key_, " '", name, "': the factory is empty");
    COHORT_CHECK(entries_.emplace(name, std::move(factory)).second, UsageError, key_, " '", name,
                 "' is registered twice");
  }

  // The factory of `name`. ConfigError listing every name when unknown;
  // `context` is appended to it (" for image tasks").
  Factory get(const std::string& name, const std::string& context = "") const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = entries_.find(name);
    COHORT_CHECK(it != entries_.end(), ConfigError, key_, " must be one of ", detail::join(names_locked()), context,
                 " (got '", name, "')");
    return it->second;
  }

  std::vector<std::string> names() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return names_locked();
  }

 private:
  std::vector<std::string> names_locked() const {
    std::vector<std::string> out;
    for (const auto& [name, f] : entries_) out.push_back(name);
    return out;
  }

  std::string key_;
  mutable std::mutex mutex_;
  std::map<std::string, Factory> entries_;
};

}  // namespace cohort
