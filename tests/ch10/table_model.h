#pragma once
// A model given by a table for chapter 10's tests: the next token's distribution depends on the
// last token only. On the host, or (Device::CUDA) with its distributions uploaded to the device
// as the GPU round asks for them.
#include <gtest/gtest.h>

#include "chapters/10_speculative_sampling/speculative.h"

namespace inferlab::test {

class TableModel : public ch10::Model {
 public:
  explicit TableModel(std::vector<ch10::Distribution> rows, Device device = Device::CPU)
      : rows_(std::move(rows)), device_(device) {}
  std::int64_t length() const override { return static_cast<std::int64_t>(held_.size()); }
  std::vector<ch10::Distribution> feed(const std::vector<std::int32_t>& tokens) override {
    ++forwards_;
    std::vector<ch10::Distribution> out;
    for (auto t : tokens) held_.push_back(t), out.push_back(rows_[static_cast<std::size_t>(t)]);
    return out;
  }
  Tensor feed_on_device(const std::vector<std::int32_t>& tokens, std::int64_t last) override {
    const std::vector<ch10::Distribution> rows = feed(tokens);
    std::vector<double> flat;
    for (auto r = rows.end() - last; r != rows.end(); ++r) flat.insert(flat.end(), r->begin(), r->end());
    return Tensor::from_vector(flat, {last, static_cast<std::int64_t>(rows_[0].size())}).to(Device::CUDA);
  }
  void truncate(std::int64_t n) override {
    ASSERT_LE(n, length());
    held_.resize(static_cast<std::size_t>(n));
  }
  std::int64_t forwards() const override { return forwards_; }
  Device device() const override { return device_; }
  const std::vector<std::int32_t>& held() const { return held_; }

 private:
  std::vector<ch10::Distribution> rows_;
  Device device_;
  std::vector<std::int32_t> held_;
  std::int64_t forwards_ = 0;
};

}  // namespace inferlab::test
