// defines: the factory of every registered task (internal to train/).
// Adding a task: implement Task in tasks/<name>.cpp, declare its factory
// here, and add one line to the table in task.cpp.
#pragma once

#include <memory>

#include "cohort/train/task.hpp"

namespace cohort {

std::unique_ptr<Task> make_bert_classify_task(const Config& cfg, const World& world);
std::unique_ptr<Task> make_bert_pretrain_task(const Config& cfg, const World& world);
std::unique_ptr<Task> make_image_classify_task(const Config& cfg, const World& world);

}  // namespace cohort
