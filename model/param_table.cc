// ParamTable construction; see param_table.h.
#include "model/param_table.h"

#include <limits>

#include "base/check.h"

namespace tt::model {

void ParamTable::Builder::begin_block(const std::string& block) {
  TT_CHECK(!open_, "param table: block '", block, "' opened inside another block");
  t_.slices_.push_back(ParamSlice{block, t_.size(), t_.size()});
  open_ = true;
}

int ParamTable::Builder::add(const std::string& name, std::vector<int64_t> shape, ParamRole role) {
  TT_CHECK(open_, "param table: tensor '", name, "' added outside a block");
  TT_CHECK(t_.find(name) < 0, "param table: tensor '", name, "' added twice");
  ParamInfo p;
  p.name = name;
  p.numel = 1;
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  for (int64_t d : shape) {
    TT_CHECK(d > 0, "param table: tensor '", name, "' has a dimension ", d, ", expected > 0");
    TT_CHECK(p.numel <= kMax / d, "param table: tensor '", name, "' has more than 2^63 elements");
    p.numel *= d;
  }
  TT_CHECK(t_.total_ <= kMax - p.numel, "param table: more than 2^63 parameters at tensor '", name, "'");
  p.shape = std::move(shape);
  p.offset = t_.total_;
  p.role = role;
  p.decay = role == ParamRole::kMatrix;
  t_.total_ += p.numel;
  t_.entries_.push_back(std::move(p));
  t_.slices_.back().end = t_.size();
  return t_.size() - 1;
}

void ParamTable::Builder::freeze_from(int first) {
  for (int i = first; i < t_.size(); ++i) t_.entries_[i].trainable = false;
}

void ParamTable::Builder::end_block() {
  TT_CHECK(open_, "param table: end_block without begin_block");
  open_ = false;
}

int ParamTable::find(const std::string& name) const {
  for (int i = 0; i < size(); ++i)
    if (entries_[i].name == name) return i;
  return -1;
}

}  // namespace tt::model
