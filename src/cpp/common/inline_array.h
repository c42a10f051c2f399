#pragma once

#include <cstddef>
#include <memory>

namespace ringtree {

// An array of `size` value-initialised elements that keeps up to N of them inside the
// object and allocates only beyond: the per-rank pointers and counts of one call, which
// then allocate nothing at the world sizes of one host. Neither copied nor moved (data()
// points into the object).
template <typename T, size_t N = 16>
class InlineArray {
 public:
  explicit InlineArray(size_t size) : size_(size) {
    if (size > N) heap_ = std::make_unique<T[]>(size);
    data_ = size > N ? heap_.get() : inline_;
  }
  InlineArray(const InlineArray&) = delete;
  InlineArray& operator=(const InlineArray&) = delete;

  size_t size() const { return size_; }
  T* data() { return data_; }
  const T* data() const { return data_; }
  T& operator[](size_t index) { return data_[index]; }
  const T& operator[](size_t index) const { return data_[index]; }

 private:
  size_t size_;
  T inline_[N]{};
  std::unique_ptr<T[]> heap_;
  T* data_ = nullptr;
};

}  // namespace ringtree
