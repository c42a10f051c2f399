#pragma once

#include <cstddef>
#include <new>
#include <utility>
#include <vector>

namespace ringtree {

// A growable array whose first N elements live inside the object: the handful of
// results one call collects (a point-to-point call's completions) then costs no
// allocation. Past N it moves everything into a std::vector and stays there (clear()
// keeps that capacity). Elements are contiguous either way. Neither copied nor moved.
template <typename T, size_t N>
class InlineVector {
 public:
  InlineVector() = default;
  InlineVector(const InlineVector&) = delete;
  InlineVector& operator=(const InlineVector&) = delete;
  ~InlineVector() { clear(); }

  void push_back(T&& value) {
    if (!onHeap_ && inlineSize_ < N) {
      new (inlineSlot(inlineSize_)) T(std::move(value));
      ++inlineSize_;
      return;
    }
    T moved(std::move(value));  // `value` may be one of the inline elements moveToHeap() ends
    if (!onHeap_) moveToHeap();
    heap_.push_back(std::move(moved));
  }

  T* data() { return onHeap_ ? heap_.data() : inlineSlot(0); }
  size_t size() const { return onHeap_ ? heap_.size() : inlineSize_; }
  bool empty() const { return size() == 0; }
  T* begin() { return data(); }
  T* end() { return data() + size(); }
  T& back() { return data()[size() - 1]; }

  void clear() {
    for (size_t i = 0; i < inlineSize_; ++i) inlineSlot(i)->~T();
    inlineSize_ = 0;
    heap_.clear();
  }

 private:
  T* inlineSlot(size_t index) { return std::launder(reinterpret_cast<T*>(storage_)) + index; }

  void moveToHeap() {
    heap_.reserve(2 * N);
    for (size_t i = 0; i < inlineSize_; ++i) {
      heap_.push_back(std::move(*inlineSlot(i)));
      inlineSlot(i)->~T();
    }
    inlineSize_ = 0;
    onHeap_ = true;
  }

  alignas(T) unsigned char storage_[N * sizeof(T)];
  size_t inlineSize_ = 0;
  bool onHeap_ = false;
  std::vector<T> heap_;
};

}  // namespace ringtree
